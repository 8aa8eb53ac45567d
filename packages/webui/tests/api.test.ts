import { afterEach, describe, expect, it, vi } from 'vitest';
import { ApiClient, ApiError, parseChunk, samplingDefaults, toApiError } from '../src/lib/services/api';

function sse(events: unknown[]): string {
	return events.map((e) => `data: ${typeof e === 'string' ? e : JSON.stringify(e)}\n\n`).join('');
}

afterEach(() => vi.unstubAllGlobals());

describe('parseChunk', () => {
	it('reads content, reasoning and timings', () => {
		expect(parseChunk('{"choices":[{"delta":{"role":"assistant","content":null}}]}')).toBeNull();
		expect(parseChunk('{"choices":[{"delta":{"content":"Hi"}}]}')).toEqual({ content: 'Hi' });
		expect(parseChunk('{"choices":[{"delta":{"reasoning_content":"hmm"}}]}')).toEqual({ reasoning: 'hmm' });
		const t = { predicted_n: 10, predicted_ms: 500, predicted_per_second: 20 };
		expect(parseChunk(JSON.stringify({ choices: [{ delta: {} }], timings: t }))).toEqual({ timings: t });
	});

	it('throws an error event', () => {
		expect(() => parseChunk('{"error":{"code":500,"message":"boom","type":"server_error"}}')).toThrow(
			ApiError
		);
	});
});

describe('toApiError', () => {
	it('classifies auth, context and loading errors', () => {
		expect(
			toApiError(401, { error: { message: 'Invalid API Key', type: 'authentication_error' } }).kind
		).toBe('auth');
		const ctx = toApiError(400, {
			error: {
				code: 400,
				message: 'too long',
				type: 'exceed_context_size_error',
				n_prompt_tokens: 3000,
				n_ctx: 2048
			}
		});
		expect(ctx.kind).toBe('context');
		expect(ctx.message).toContain('3000 tokens');
		expect(toApiError(503, { error: { message: 'Loading model' } }).kind).toBe('loading');
		expect(toApiError(500, null).kind).toBe('server');
	});
});

describe('samplingDefaults', () => {
	it('rounds float32 values and maps n_predict', () => {
		const s = samplingDefaults({
			temperature: 0.800000011920929,
			top_k: 40,
			n_predict: -1,
			min_p: 0.05000000074505806
		});
		expect(s.temperature).toBe(0.8);
		expect(s.min_p).toBe(0.05);
		expect(s.max_tokens).toBe(-1);
		expect(s.top_k).toBe(40);
	});
});

describe('ApiClient', () => {
	it('streams a chat reply with the key as a bearer token', async () => {
		const fetchMock = vi.fn(
			async () =>
				new Response(
					sse([
						{ choices: [{ delta: { role: 'assistant', content: null } }] },
						{ choices: [{ delta: { content: 'Hel' } }] },
						{ choices: [{ delta: { content: 'lo' } }], timings: { predicted_per_second: 12.5 } },
						'[DONE]'
					])
				)
		);
		vi.stubGlobal('fetch', fetchMock);
		const api = new ApiClient('http://x/', 'secret');
		const steps = [];
		const chat = api.chat([{ role: 'user', content: 'hi' }], { temperature: 0 }, undefined, {
			streamId: 'conv-1',
			model: 'org/m:Q8_0'
		});
		for await (const s of chat) steps.push(s);
		const deltas = steps.map((s) => s.delta);
		expect(deltas.map((d) => d?.content ?? '').join('')).toBe('Hello');
		expect(deltas.at(-2)?.timings?.predicted_per_second).toBe(12.5);
		expect(deltas.at(-1)).toBeNull(); // [DONE]
		const [url, init] = fetchMock.mock.calls[0] as unknown as [string, RequestInit];
		expect(url).toBe('http://x/v1/chat/completions');
		const headers = init.headers as Record<string, string>;
		expect(headers.Authorization).toBe('Bearer secret');
		expect(headers['X-Conversation-Id']).toBe('conv-1');
		expect(JSON.parse(init.body as string)).toMatchObject({
			stream: true,
			temperature: 0,
			model: 'org/m:Q8_0'
		});
	});

	it('replays a stream from an offset, looks streams up and stops them', async () => {
		const body = sse([{ choices: [{ delta: { content: 'lo' } }] }, '[DONE]']);
		const calls: [string, RequestInit][] = [];
		vi.stubGlobal('fetch', async (url: string, init: RequestInit) => {
			calls.push([url, init]);
			if (url.includes('lookup')) return new Response('[{"conversation_id":"a/b::m","is_done":false}]');
			if (init.method === 'DELETE') return new Response(null, { status: 204 });
			return new Response(body);
		});
		const api = new ApiClient('http://x/');
		const steps = [];
		for await (const s of api.resume('a/b::m', 100)) steps.push(s);
		expect(calls[0][0]).toBe('http://x/v1/stream?conv_id=a%2Fb%3A%3Am&from=100');
		expect(steps[0]).toEqual({ delta: { content: 'lo' }, offset: 100 + body.indexOf('data: [DONE]') });
		expect(steps[1].offset).toBe(100 + body.length);
		expect(await api.lookupStreams(['a/b::m'])).toHaveLength(1);
		expect(JSON.parse(calls[1][1].body as string)).toEqual({ conversation_ids: ['a/b::m'] });
		await api.stopStream('a/b::m');
		expect(calls[2]).toMatchObject(['http://x/v1/stream?conv_id=a%2Fb%3A%3Am', { method: 'DELETE' }]);
	});

	it('reads the flat error bodies of the tools API', () => {
		const err = toApiError(404, {
			code: 400,
			message: 'unknown tool "x"',
			type: 'invalid_request_error'
		} as never);
		expect(err.message).toMatch(/unknown tool "x"/);
	});

	it('reports a server that cannot be reached', async () => {
		vi.stubGlobal(
			'fetch',
			vi.fn(async () => Promise.reject(new TypeError('Failed to fetch')))
		);
		await expect(new ApiClient().props()).rejects.toMatchObject({ kind: 'network' });
	});

	it('reports a wrong key', async () => {
		const body = { error: { code: 401, message: 'Invalid API Key', type: 'authentication_error' } };
		vi.stubGlobal(
			'fetch',
			vi.fn(async () => new Response(JSON.stringify(body), { status: 401 }))
		);
		await expect(new ApiClient().props()).rejects.toMatchObject({ kind: 'auth', status: 401 });
	});
});
