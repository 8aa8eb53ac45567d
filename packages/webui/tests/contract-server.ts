/**
 * An in-memory server that follows llama-server's contract for what the chat store uses: streamed
 * `/v1/chat/completions` with `X-Conversation-Id` sessions (a byte buffer that keeps filling when the
 * client goes away), `GET /v1/stream?conv_id&from`, `POST /v1/streams/lookup`, `DELETE /v1/stream`,
 * `GET /tools` and `POST /tools`. Install its `fetch` with `vi.stubGlobal`. The browser tests run the
 * same flows against the real server.
 */
import type { ServerTool } from '../src/lib/services/tools';

interface Session {
	bytes: Uint8Array;
	done: boolean;
	cancelled: boolean;
	wake: (() => void)[];
}

const enc = new TextEncoder();
const json = (body: unknown, status = 200) =>
	new Response(JSON.stringify(body), { status, headers: { 'Content-Type': 'application/json' } });

export class ContractServer {
	sessions = new Map<string, Session>();
	/** the chunks of each reply to come, in order (one list per chat request) */
	replies: unknown[][] = [];
	/** parsed bodies and stream ids of the chat requests */
	requests: { body: Record<string, unknown>; streamId: string | null }[] = [];
	tools: ServerTool[] = [];
	toolRuns: { tool: string; params: unknown }[] = [];
	toolResult: unknown = { plain_text_response: 'ok' };
	/** cut the next chat response's body (not the generation) after this many bytes */
	dropAfter: number | null = null;
	/** ms between two produced chunks */
	delay = 1;
	/** hosts whose clients are gone (a closed page): their requests and reads never go on */
	gone = new Set<string>();

	fetch = async (input: string | URL | Request, init: RequestInit = {}): Promise<Response> => {
		const url = new URL(String(input), 'http://server/');
		const method = init.method ?? 'GET';
		const headers = new Headers(init.headers);
		if (this.gone.has(url.host)) return new Promise<Response>(() => {});
		const route = `${method} ${url.pathname}`;
		if (route === 'POST /v1/chat/completions') return this.chat(init, headers, url.host);
		if (route === 'GET /v1/stream') return this.replay(url, init.signal ?? undefined);
		if (route === 'DELETE /v1/stream') {
			const s = this.sessions.get(url.searchParams.get('conv_id') ?? '');
			if (s) this.finish(s, true);
			this.sessions.delete(url.searchParams.get('conv_id') ?? '');
			return new Response(null, { status: 204 });
		}
		if (route === 'POST /v1/streams/lookup') {
			const ids: string[] = JSON.parse(String(init.body)).conversation_ids ?? [];
			return json(
				ids
					.filter((id) => this.sessions.has(id))
					.map((id) => {
						const s = this.sessions.get(id)!;
						return { conversation_id: id, is_done: s.done, total_bytes: s.bytes.length };
					})
			);
		}
		if (route === 'GET /tools') return json(this.tools);
		if (route === 'POST /tools') {
			const { tool, params } = JSON.parse(String(init.body));
			this.toolRuns.push({ tool, params });
			return json(this.toolResult);
		}
		return json({ error: { code: 404, message: 'File Not Found', type: 'not_found_error' } }, 404);
	};

	/** Start a generation (in a session when the header is given) and stream it to this client. */
	private chat(init: RequestInit, headers: Headers, host: string): Response {
		const streamId = headers.get('x-conversation-id');
		this.requests.push({ body: JSON.parse(String(init.body)), streamId });
		const chunks = this.replies.shift() ?? [{ choices: [{ delta: { content: '…' } }] }];
		const old = streamId ? this.sessions.get(streamId) : undefined;
		if (old) this.finish(old, true); // a new request replaces the conversation's session
		const s: Session = { bytes: new Uint8Array(0), done: false, cancelled: false, wake: [] };
		if (streamId) this.sessions.set(streamId, s);
		void this.produce(s, chunks);
		const cut = this.dropAfter;
		this.dropAfter = null;
		return this.reader(s, 0, init.signal ?? undefined, cut, host);
	}

	private async produce(s: Session, chunks: unknown[]): Promise<void> {
		const events = [...chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`), 'data: [DONE]\n\n'];
		for (const e of events) {
			await new Promise((r) => setTimeout(r, this.delay));
			if (s.cancelled) return;
			const b = enc.encode(e);
			const next = new Uint8Array(s.bytes.length + b.length);
			next.set(s.bytes);
			next.set(b, s.bytes.length);
			s.bytes = next;
			s.wake.splice(0).forEach((w) => w());
		}
		this.finish(s, false);
	}

	private finish(s: Session, cancel: boolean): void {
		s.cancelled ||= cancel;
		s.done = true;
		s.wake.splice(0).forEach((w) => w());
	}

	private replay(url: URL, signal?: AbortSignal): Response {
		const s = this.sessions.get(url.searchParams.get('conv_id') ?? '');
		if (!s)
			return json(
				{ error: { code: 404, message: 'Stream not found or expired', type: 'not_found_error' } },
				404
			);
		return this.reader(s, Number(url.searchParams.get('from') ?? 0), signal, null);
	}

	/** A response body reading a session from `pos` on; `cut` ends it with a network error. */
	private reader(
		s: Session,
		pos: number,
		signal: AbortSignal | undefined,
		cut: number | null,
		host = ''
	): Response {
		signal?.addEventListener('abort', () => s.wake.splice(0).forEach((w) => w()));
		const body = new ReadableStream<Uint8Array>({
			pull: async (c) => {
				while (pos >= s.bytes.length && !s.done && !signal?.aborted)
					await new Promise<void>((r) => s.wake.push(r));
				if (this.gone.has(host)) return new Promise<void>(() => {});
				if (signal?.aborted) return c.error(new DOMException('aborted', 'AbortError'));
				if (cut !== null && pos >= cut) return c.error(new TypeError('network error'));
				if (pos >= s.bytes.length) return c.close();
				const end = cut !== null ? Math.min(cut, s.bytes.length) : s.bytes.length;
				c.enqueue(s.bytes.slice(pos, end));
				pos = end;
			}
		});
		return new Response(body, { headers: { 'Content-Type': 'text/event-stream' } });
	}
}

/** A chat chunk that adds `content`. */
export const text = (content: string) => ({ choices: [{ delta: { content } }] });

/** A chat chunk with one whole tool call. */
export const toolCall = (id: string, name: string, args: unknown) => ({
	choices: [
		{ delta: { tool_calls: [{ index: 0, id, function: { name, arguments: JSON.stringify(args) } }] } }
	]
});

/** A tool as `GET /tools` lists it. */
export function serverTool(name: string, write: boolean): ServerTool {
	return {
		tool: name,
		display_name: name,
		type: 'server',
		permissions: { write },
		definition: { type: 'function', function: { name, parameters: { type: 'object', properties: {} } } }
	};
}
