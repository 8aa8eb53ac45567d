/**
 * The llama-server HTTP API the app uses: `/props`, streaming `/v1/chat/completions` and its resumable
 * streams (`X-Conversation-Id`, `/v1/stream`, `/v1/streams/lookup`). Tools and router-mode model
 * management build on `send` (services/tools.ts, services/models.ts).
 */
import type { SamplingParams, Timings } from '$lib/types';
import { sseEvents } from './sse';

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
	/** `router` when the server is llama-router (or llama-server in router mode) */
	role?: string;
	default_generation_settings: { params: Record<string, unknown>; n_ctx: number };
	modalities?: { vision?: boolean; audio?: boolean };
	model_alias?: string;
	model_path?: string;
	build_info?: string;
	/** the server keeps conversations (`--store`): the app stores its chats there */
	endpoint_conversations?: boolean;
}

export type ContentPart = { type: 'text'; text: string } | { type: 'image_url'; image_url: { url: string } };

/** A tool call in OpenAI's request shape. */
export interface ChatToolCall {
	id: string;
	type: 'function';
	function: { name: string; arguments: string };
}

export interface ChatMessage {
	role: 'system' | 'user' | 'assistant' | 'tool';
	content: string | ContentPart[];
	tool_calls?: ChatToolCall[];
	tool_call_id?: string;
}

/** A piece of a streamed tool call: the call at `index` gets its id and name once, its arguments in parts. */
export interface ToolCallDelta {
	index: number;
	id?: string;
	function?: { name?: string; arguments?: string };
}

/** What one streamed chunk adds to the reply. */
export interface ChatDelta {
	content?: string;
	reasoning?: string;
	toolCalls?: ToolCallDelta[];
	timings?: Timings;
}

/** A chunk's delta and the stream's byte offset after it (where a replay would go on from). */
export interface StreamStep {
	delta: ChatDelta | null;
	offset: number;
}

/** Options of one chat request. */
export interface ChatOptions {
	/** `X-Conversation-Id`: the server keeps generating into a replay buffer if the connection drops */
	streamId?: string;
	/** OpenAI function tools offered to the model */
	tools?: unknown[];
	/** router mode: the model to use */
	model?: string;
}

/** One entry of `POST /v1/streams/lookup`. */
export interface StreamInfo {
	conversation_id: string;
	is_done: boolean;
	total_bytes: number;
	started_at: number;
	completed_at: number;
}

interface ErrorBody {
	error?: { code?: number; message?: string; type?: string; n_prompt_tokens?: number; n_ctx?: number };
}

/** Turn an error response (status and parsed body) into an ApiError with a message for people. */
export function toApiError(status: number, body: ErrorBody | null): ApiError {
	// most errors are wrapped in `error`; the tools API's are flat
	const err = body?.error && typeof body.error === 'object' ? body.error : (body as ErrorBody['error']);
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

	private headers(extra: Record<string, string> = {}): Record<string, string> {
		const h: Record<string, string> = { 'Content-Type': 'application/json', ...extra };
		if (this.apiKey) h.Authorization = `Bearer ${this.apiKey}`;
		return h;
	}

	/**
	 * A request to the server (JSON, with the API key); a failure is thrown as an ApiError, an abort as
	 * the browser's AbortError.
	 */
	async send(
		path: string,
		init: RequestInit & { extraHeaders?: Record<string, string> } = {}
	): Promise<Response> {
		const { extraHeaders, ...rest } = init;
		let res: Response;
		try {
			res = await fetch(this.url(path), { ...rest, headers: this.headers(extraHeaders) });
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
		return (await this.send('props')).json();
	}

	/** Check the API key with a request that needs one. */
	async models(): Promise<unknown> {
		return (await this.send('v1/models')).json();
	}

	/**
	 * Stream a chat completion: yields each chunk's content, reasoning, tool calls and timings with the
	 * stream's byte offset after it. Abort `signal` to stop reading (with a `streamId` the server goes
	 * on generating until `stopStream`); an error event inside the stream is thrown as an ApiError.
	 */
	async *chat(
		messages: ChatMessage[],
		params: Partial<SamplingParams>,
		signal?: AbortSignal,
		options: ChatOptions = {}
	): AsyncGenerator<StreamStep> {
		const body = JSON.stringify({
			messages,
			stream: true,
			timings_per_token: true,
			...(options.model ? { model: options.model } : {}),
			...(options.tools?.length ? { tools: options.tools } : {}),
			...params
		});
		const extraHeaders: Record<string, string> = options.streamId
			? { 'X-Conversation-Id': options.streamId }
			: {};
		const res = await this.send('v1/chat/completions', { method: 'POST', body, signal, extraHeaders });
		yield* steps(res, 0);
	}

	/** Re-attach to a resumable stream: its bytes from offset `from` on, then the live ones. */
	async *resume(streamId: string, from: number, signal?: AbortSignal): AsyncGenerator<StreamStep> {
		const q = `conv_id=${encodeURIComponent(streamId)}&from=${from}`;
		yield* steps(await this.send(`v1/stream?${q}`, { signal }), from);
	}

	/** The server's sessions among `ids` (it answers only for ids the caller names). */
	async lookupStreams(ids: string[]): Promise<StreamInfo[]> {
		const body = JSON.stringify({ conversation_ids: ids });
		const found = await (await this.send('v1/streams/lookup', { method: 'POST', body })).json();
		return Array.isArray(found) ? (found as StreamInfo[]) : [];
	}

	/** Stop a detached generation and drop its replay buffer (idempotent). */
	async stopStream(streamId: string): Promise<void> {
		await this.send(`v1/stream?conv_id=${encodeURIComponent(streamId)}`, { method: 'DELETE' });
	}
}

/** The steps of a streamed reply whose body starts at byte `start`; ends at `[DONE]` or the end. */
async function* steps(res: Response, start: number): AsyncGenerator<StreamStep> {
	if (!res.body) throw new ApiError('server', 'The server sent no reply.');
	for await (const { data, offset, partial } of sseEvents(res.body, start)) {
		if (partial) return; // cut inside an event: a replay from `offset` sends all of it
		if (data === '[DONE]') {
			yield { delta: null, offset };
			return;
		}
		yield { delta: parseChunk(data), offset };
	}
}

/** One `data:` payload of a chat stream as a ChatDelta (null when it adds nothing). */
export function parseChunk(data: string): ChatDelta | null {
	const chunk = JSON.parse(data) as {
		choices?: {
			delta?: {
				content?: string | null;
				reasoning_content?: string | null;
				tool_calls?: ToolCallDelta[];
			};
		}[];
		timings?: Timings;
	} & ErrorBody;
	if (chunk.error) throw toApiError(chunk.error.code ?? 500, chunk);
	const d = chunk.choices?.[0]?.delta;
	const out: ChatDelta = {};
	if (d?.content) out.content = d.content;
	if (d?.reasoning_content) out.reasoning = d.reasoning_content;
	if (d?.tool_calls?.length) out.toolCalls = d.tool_calls;
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
