/**
 * Server-sent events: split a byte stream into the `data:` payloads of its events.
 * Events are separated by a blank line; `:` lines are comments (the server's keep-alive pings).
 *
 * The split works on bytes, not text, so each event can report the byte offset just past its end: a
 * resumable stream is replayed from such an offset (`GET /v1/stream?from=`), which counts bytes.
 */

/** One event's data and the absolute byte offset just past the blank line that ended it. */
export interface SseEvent {
	data: string;
	offset: number;
	/** the stream ended inside this event (no blank line after it): a replay from `offset` sends it again */
	partial?: boolean;
}

const LF = 10;
const CR = 13;

/**
 * The events of a stream whose first byte is at absolute offset `start` (0 for a new stream, the `from`
 * of a replay). Comment-only events are skipped but still move the offset.
 */
export async function* sseEvents(stream: ReadableStream<Uint8Array>, start = 0): AsyncGenerator<SseEvent> {
	const reader = stream.getReader();
	const decoder = new TextDecoder();
	let buffer: Uint8Array = new Uint8Array(0);
	let base = start; // absolute offset of buffer[0]
	try {
		for (;;) {
			const { value, done } = await reader.read();
			if (done) break;
			buffer = concat(buffer, value);
			let cut: [number, number] | null;
			while ((cut = eventEnd(buffer))) {
				const [end, next] = cut;
				const data = eventData(decoder.decode(buffer.subarray(0, end)));
				buffer = buffer.slice(next);
				base += next;
				if (data !== null) yield { data, offset: base };
			}
		}
		// a last event without its blank line: the offset stays before it
		const data = eventData(decoder.decode(buffer));
		if (data !== null) yield { data, offset: base, partial: true };
	} finally {
		reader.releaseLock();
	}
}

/** The `data:` payloads of a stream's events. */
export async function* sseData(stream: ReadableStream<Uint8Array>): AsyncGenerator<string> {
	for await (const e of sseEvents(stream)) yield e.data;
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
	if (!a.length) return b;
	const out = new Uint8Array(a.length + b.length);
	out.set(a);
	out.set(b, a.length);
	return out;
}

/** Where the first complete event ends: [end of its text, start of the next event], or null. */
function eventEnd(buf: Uint8Array): [number, number] | null {
	for (let i = buf.indexOf(LF); i >= 0; i = buf.indexOf(LF, i + 1)) {
		// a line ends at i; the event ends when the next line is empty (LF or CRLF)
		const end = i > 0 && buf[i - 1] === CR ? i - 1 : i;
		if (buf[i + 1] === LF) return [end, i + 2];
		if (buf[i + 1] === CR && buf[i + 2] === LF) return [end, i + 3];
	}
	return null;
}

/** The joined `data:` lines of one event, or null when it has none. */
export function eventData(event: string): string | null {
	const lines = event
		.split(/\r?\n/)
		.filter((line) => line.startsWith('data:'))
		.map((line) => line.slice(5).replace(/^ /, ''));
	return lines.length ? lines.join('\n') : null;
}
