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
		const deltas = [];
		for await (const d of api.chat([{ role: 'user', content: 'hi' }], { temperature: 0 })) deltas.push(d);
		expect(deltas.map((d) => d.content ?? '').join('')).toBe('Hello');
		expect(deltas.at(-1)?.timings?.predicted_per_second).toBe(12.5);
		const [url, init] = fetchMock.mock.calls[0] as unknown as [string, RequestInit];
		expect(url).toBe('http://x/v1/chat/completions');
		expect((init.headers as Record<string, string>).Authorization).toBe('Bearer secret');
		expect(JSON.parse(init.body as string)).toMatchObject({ stream: true, temperature: 0 });
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
