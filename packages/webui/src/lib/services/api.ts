/** The llama-server HTTP API the app uses: `/props` and streaming `/v1/chat/completions`. */
import type { SamplingParams, Timings } from '$lib/types';
import { sseData } from './sse';

export type ApiErrorKind = 'network' | 'auth' | 'context' | 'loading' | 'server';

/** A failed request, classified so the UI can say what to do about it. */
export class ApiError extends Error {
	constructor(
		readonly kind: ApiErrorKind,
		message: string,
		readonly status = 0
	) {
		super(message);
		this.name = 'ApiError';
	}
}

export interface ServerProps {
	default_generation_settings: { params: Record<string, unknown>; n_ctx: number };
	modalities?: { vision?: boolean; audio?: boolean };
	model_alias?: string;
	model_path?: string;
	build_info?: string;
}

export type ContentPart = { type: 'text'; text: string } | { type: 'image_url'; image_url: { url: string } };

export interface ChatMessage {
	role: 'system' | 'user' | 'assistant';
	content: string | ContentPart[];
}

/** What one streamed chunk adds to the reply. */
export interface ChatDelta {
	content?: string;
	reasoning?: string;
	timings?: Timings;
}

interface ErrorBody {
	error?: { code?: number; message?: string; type?: string; n_prompt_tokens?: number; n_ctx?: number };
}

/** Turn an error response (status and parsed body) into an ApiError with a message for people. */
export function toApiError(status: number, body: ErrorBody | null): ApiError {
	const err = body?.error;
	const detail = err?.message ?? `HTTP ${status}`;
	if (status === 401 || err?.type === 'authentication_error')
		return new ApiError('auth', 'The server rejected the API key. Enter the right key in Settings.', 401);
	if (err?.type === 'exceed_context_size_error') {
		const sizes = err.n_prompt_tokens
			? ` (${err.n_prompt_tokens} tokens, the context holds ${err.n_ctx})`
			: '';
		return new ApiError(
			'context',
			`The conversation is too long for the model's context${sizes}. Start a new conversation or delete messages.`,
			status
		);
	}
	if (status === 503) return new ApiError('loading', `The server is not ready: ${detail}`, status);
	return new ApiError('server', `Server error ${status}: ${detail}`, status);
}

export class ApiClient {
	/**
	 * @param base URL the API paths are resolved against ('' : the page's own folder, so the app also works
	 *   behind an API prefix)
	 * @param apiKey sent as a Bearer token when set
	 */
	constructor(
		private base = '',
		public apiKey = ''
	) {}

	private url(path: string): string {
		return this.base ? new URL(path, this.base).href : path;
	}

	private headers(): Record<string, string> {
		const h: Record<string, string> = { 'Content-Type': 'application/json' };
		if (this.apiKey) h.Authorization = `Bearer ${this.apiKey}`;
		return h;
	}

	private async request(path: string, init: RequestInit = {}): Promise<Response> {
		let res: Response;
		try {
			res = await fetch(this.url(path), { ...init, headers: this.headers() });
		} catch (e) {
			if (e instanceof DOMException && e.name === 'AbortError') throw e;
			throw new ApiError('network', 'Cannot reach the server. Is llama-server running?');
		}
		if (!res.ok) {
			const body = (await res.json().catch(() => null)) as ErrorBody | null;
			throw toApiError(res.status, body);
		}
		return res;
	}

	/** The server's properties: default sampling settings, context size, modalities. */
	async props(): Promise<ServerProps> {
		return (await this.request('props')).json();
	}

	/** Check the API key with a request that needs one. */
	async models(): Promise<unknown> {
		return (await this.request('v1/models')).json();
	}

	/**
	 * Stream a chat completion: yields the content, reasoning and timings of each chunk.
	 * Abort `signal` to stop; an error event inside the stream is thrown as an ApiError.
	 */
	async *chat(
		messages: ChatMessage[],
		params: Partial<SamplingParams>,
		signal?: AbortSignal
	): AsyncGenerator<ChatDelta> {
		const body = JSON.stringify({
			messages,
			stream: true,
			timings_per_token: true,
			...params
		});
		const res = await this.request('v1/chat/completions', { method: 'POST', body, signal });
		if (!res.body) throw new ApiError('server', 'The server sent no reply.');
		for await (const data of sseData(res.body)) {
			if (data === '[DONE]') return;
			const delta = parseChunk(data);
			if (delta) yield delta;
		}
	}
}

/** One `data:` payload of a chat stream as a ChatDelta (null when it adds nothing). */
export function parseChunk(data: string): ChatDelta | null {
	const chunk = JSON.parse(data) as {
		choices?: { delta?: { content?: string | null; reasoning_content?: string | null } }[];
		timings?: Timings;
	} & ErrorBody;
	if (chunk.error) throw toApiError(chunk.error.code ?? 500, chunk);
	const d = chunk.choices?.[0]?.delta;
	const out: ChatDelta = {};
	if (d?.content) out.content = d.content;
	if (d?.reasoning_content) out.reasoning = d.reasoning_content;
	if (chunk.timings) out.timings = chunk.timings;
	return Object.keys(out).length ? out : null;
}

/** The sampling defaults in `/props` as SamplingParams (`n_predict` is the server's name for max tokens). */
export function samplingDefaults(params: Record<string, unknown>): SamplingParams {
	const num = (key: string, fallback: number) =>
		typeof params[key] === 'number' ? (params[key] as number) : fallback;
	const round = (x: number) => Math.round(x * 1e6) / 1e6; // 0.800000011920929 -> 0.8
	return {
		temperature: round(num('temperature', 0.8)),
		top_k: num('top_k', 40),
		top_p: round(num('top_p', 0.95)),
		min_p: round(num('min_p', 0.05)),
		max_tokens: num('max_tokens', num('n_predict', -1)),
		repeat_penalty: round(num('repeat_penalty', 1)),
		presence_penalty: round(num('presence_penalty', 0)),
		frequency_penalty: round(num('frequency_penalty', 0)),
		seed: num('seed', -1)
	};
}
