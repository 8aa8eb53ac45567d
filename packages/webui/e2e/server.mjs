// Start and stop a real llama-server (the Python package, bundled SmolLM2 model) for the browser tests.
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

/** Start `python -m llama_server` and wait until /health answers 200. */
export async function startServer({ python, args = [], log, timeoutMs = 300_000 }) {
	const port = await freePort();
	const out = openSync(log, 'w');
	const proc = spawn(python, ['-m', 'llama_server', '--port', String(port), ...args], {
		stdio: ['ignore', out, out],
		env: { ...process.env, PYTHONUNBUFFERED: '1' }
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
