import { describe, expect, it } from 'vitest';
import { eventData, sseData, sseEvents } from '../src/lib/services/sse';

function streamOf(...pieces: string[]): ReadableStream<Uint8Array> {
	const enc = new TextEncoder();
	return new ReadableStream({
		start(c) {
			for (const p of pieces) c.enqueue(enc.encode(p));
			c.close();
		}
	});
}

async function collect(stream: ReadableStream<Uint8Array>): Promise<string[]> {
	const out: string[] = [];
	for await (const d of sseData(stream)) out.push(d);
	return out;
}

describe('sseData', () => {
	it('yields the data of each event', async () => {
		expect(await collect(streamOf('data: {"a":1}\n\ndata: [DONE]\n\n'))).toEqual(['{"a":1}', '[DONE]']);
	});

	it('joins events split across chunks, even inside a UTF-8 character', async () => {
		const bytes = new TextEncoder().encode('data: {"t":"é"}\n\n');
		const cut = bytes.indexOf(0xc3) + 1;
		const stream = new ReadableStream<Uint8Array>({
			start(c) {
				c.enqueue(bytes.slice(0, cut));
				c.enqueue(bytes.slice(cut));
				c.close();
			}
		});
		expect(await collect(stream)).toEqual(['{"t":"é"}']);
	});

	it('skips keep-alive comments and accepts CRLF', async () => {
		expect(await collect(streamOf(':\n\n', 'data: x\r\n\r\n', 'data: y'))).toEqual(['x', 'y']);
	});

	it('joins multi-line data', () => {
		expect(eventData('event: e\ndata: a\ndata: b')).toBe('a\nb');
		expect(eventData(': ping')).toBeNull();
	});
});

describe('sseEvents', () => {
	it('reports the byte offset after each event, from a replay start and across UTF-8', async () => {
		const first = 'data: {"t":"é"}\n\n';
		const stream = streamOf(first, ':\n\n', 'data: [DONE]\n\n');
		const out = [];
		for await (const e of sseEvents(stream, 7)) out.push(e);
		const n = new TextEncoder().encode(first).length;
		expect(out).toEqual([
			{ data: '{"t":"é"}', offset: 7 + n },
			{ data: '[DONE]', offset: 7 + n + 3 + 14 }
		]);
	});

	it('keeps the offset before an event that was cut off', async () => {
		const out = [];
		for await (const e of sseEvents(streamOf('data: a\r\n\r\ndata: b'))) out.push(e);
		expect(out).toEqual([
			{ data: 'a', offset: 11 },
			{ data: 'b', offset: 11, partial: true }
		]);
	});
});
