/**
 * Server-sent events: split a byte stream into the `data:` payloads of its events.
 * Events are separated by a blank line; `:` lines are comments (the server's keep-alive pings).
 */
export async function* sseData(stream: ReadableStream<Uint8Array>): AsyncGenerator<string> {
	const reader = stream.getReader();
	const decoder = new TextDecoder(); // streaming: keeps a UTF-8 sequence cut between chunks
	let buffer = '';
	try {
		for (;;) {
			const { value, done } = await reader.read();
			if (done) break;
			buffer += decoder.decode(value, { stream: true });
			let end: number;
			while ((end = eventEnd(buffer)) >= 0) {
				const data = eventData(buffer.slice(0, end));
				buffer = buffer.slice(end).replace(/^(\r?\n){2}/, '');
				if (data !== null) yield data;
			}
		}
		const data = eventData(buffer + decoder.decode());
		if (data !== null) yield data;
	} finally {
		reader.releaseLock();
	}
}

/** Index of the blank line that ends the first complete event, or -1. */
function eventEnd(buffer: string): number {
	const m = /\r?\n\r?\n/.exec(buffer);
	return m ? m.index : -1;
}

/** The joined `data:` lines of one event, or null when it has none. */
export function eventData(event: string): string | null {
	const lines = event
		.split(/\r?\n/)
		.filter((line) => line.startsWith('data:'))
		.map((line) => line.slice(5).replace(/^ /, ''));
	return lines.length ? lines.join('\n') : null;
}
