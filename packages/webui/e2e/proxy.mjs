// A TCP relay in front of the server, so a browser test can cut every open connection: a real network drop.
import { connect, createServer } from 'node:net';

/** Relay 127.0.0.1:<free port> to `target` (http://host:port); `drop()` destroys the open connections. */
export function startRelay(target) {
	const { hostname, port } = new URL(target);
	const open = new Set();
	const server = createServer((client) => {
		const upstream = connect(Number(port), hostname);
		const pair = [client, upstream];
		open.add(pair);
		const end = () => {
			open.delete(pair);
			client.destroy();
			upstream.destroy();
		};
		client.on('error', end).on('close', end);
		upstream.on('error', end).on('close', end);
		client.pipe(upstream);
		upstream.pipe(client);
	});
	return new Promise((resolve) => {
		server.listen(0, '127.0.0.1', () => {
			resolve({
				url: `http://127.0.0.1:${server.address().port}`,
				/** cut every connection now open (new ones go through again) */
				drop() {
					for (const [a, b] of [...open]) {
						a.destroy();
						b.destroy();
					}
					open.clear();
				},
				close: () => new Promise((r) => server.close(() => r()))
			});
		});
	});
}
