// Start and stop a real llama-server or llama-router (the Python packages, bundled SmolLM2 model) for the
// browser tests, and serve the built app in front of a server that does not serve it itself.
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { openSync } from 'node:fs';

export function freePort() {
	return new Promise((resolve, reject) => {
		const srv = createServer();
		srv.listen(0, '127.0.0.1', () => {
			const { port } = srv.address();
			srv.close(() => resolve(port));
		});
		srv.on('error', reject);
	});
}

/**
 * Start `python -m llama_server` (or `module`, e.g. llama_router) in `cwd` (where its tools work) and
 * wait until /health answers 200.
 */
export async function startServer({
	python,
	args = [],
	log,
	cwd,
	module = 'llama_server',
	env = {},
	timeoutMs = 300_000
}) {
	const port = await freePort();
	const out = openSync(log, 'w');
	const proc = spawn(python, ['-m', module, '--port', String(port), ...args], {
		cwd,
		stdio: ['ignore', out, out],
		env: { ...process.env, PYTHONUNBUFFERED: '1', ...env }
	});
	const url = `http://127.0.0.1:${port}`;
	const deadline = Date.now() + timeoutMs;
	while (Date.now() < deadline) {
		if (proc.exitCode !== null || proc.signalCode !== null)
			throw new Error(`llama-server exited (${proc.exitCode}); see ${log}`);
		try {
			if ((await fetch(`${url}/health`)).status === 200) return { url, proc, stop: () => stopServer(proc) };
		} catch {
			// not listening yet
		}
		await new Promise((r) => setTimeout(r, 500));
	}
	await stopServer(proc);
	throw new Error(`llama-server did not become ready; see ${log}`);
}

export function stopServer(proc) {
	if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve(); // already ended
	return new Promise((resolve) => {
		const timer = setTimeout(() => proc.kill('SIGKILL'), 20_000);
		proc.once('exit', () => {
			clearTimeout(timer);
			resolve();
		});
		proc.kill('SIGTERM');
	});
}

/**
 * Serve the built app (`dir`) at a free loopback port and forward every other request to `target`, as a
 * reverse proxy in front of an API server would.
 */
export async function serveApp(dir, target) {
	const { createServer: createHttp, request } = await import('node:http');
	const { readFile } = await import('node:fs/promises');
	const { extname, join, normalize } = await import('node:path');
	const types = {
		'.html': 'text/html',
		'.js': 'text/javascript',
		'.css': 'text/css',
		'.svg': 'image/svg+xml'
	};
	const up = new URL(target);
	const server = createHttp(async (req, res) => {
		const path = new URL(req.url, 'http://x').pathname;
		const file = path === '/' ? 'index.html' : normalize(path).replace(/^\/+/, '');
		if (req.method === 'GET' && (path === '/' || path.startsWith('/_app/') || path === '/favicon.svg')) {
			try {
				const body = await readFile(join(dir, file));
				res.writeHead(200, { 'Content-Type': types[extname(file)] ?? 'application/octet-stream' });
				return res.end(body);
			} catch {
				res.writeHead(404);
				return res.end();
			}
		}
		const fwd = request(
			{ host: up.hostname, port: up.port, path: req.url, method: req.method, headers: req.headers },
			(r) => {
				res.writeHead(r.statusCode ?? 502, r.headers);
				r.pipe(res);
			}
		);
		fwd.on('error', () => res.destroy());
		res.on('close', () => fwd.destroy());
		req.pipe(fwd);
	});
	const port = await freePort();
	await new Promise((r) => server.listen(port, '127.0.0.1', r));
	return { url: `http://127.0.0.1:${port}`, close: () => new Promise((r) => server.close(() => r())) };
}
