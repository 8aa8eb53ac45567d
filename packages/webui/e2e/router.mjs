// Browser tests of the web UI in router mode: a real llama-router with SmolLM2 under two names (children
// are real llama-server processes) and a "vision" entry (a projector file beside the model, so the router
// reports image input without loading it).
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { launch, send, shot, waitForReply } from './harness.mjs';
import { serveApp, startServer } from './server.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const app = join(here, '..', 'src', 'llama_webui', 'static');

/** The bundled SmolLM2 file, as llama-server finds it (the model package is not imported). */
async function smollm2(python) {
	const { execFileSync } = await import('node:child_process');
	const code = 'from llama_server.config import bundled_model_path as p; print(p())';
	return execFileSync(python, ['-c', code], { encoding: 'utf8' }).trim();
}

/**
 * A file server on loopback standing in for a model host: serves `file` at /<name>, slowly (about
 * 16 MiB/s) so the download's progress can be seen.
 */
async function modelHost(file, name) {
	const body = readFileSync(file);
	const server = createServer((req, res) => {
		if (req.url !== `/${name}`) {
			res.writeHead(404);
			return res.end();
		}
		res.writeHead(200, { 'Content-Length': body.length, 'Content-Type': 'application/octet-stream' });
		if (req.method === 'HEAD') return res.end();
		let pos = 0;
		const timer = setInterval(() => {
			const end = Math.min(pos + (1 << 20), body.length);
			res.write(body.subarray(pos, end));
			pos = end;
			if (pos >= body.length) {
				clearInterval(timer);
				res.end();
			}
		}, 60);
		res.on('close', () => clearInterval(timer));
	});
	await new Promise((r) => server.listen(0, '127.0.0.1', r));
	return {
		url: `http://127.0.0.1:${server.address().port}/${name}`,
		close: () => new Promise((r) => server.close(() => r()))
	};
}

/** The model badge text of one model in the open models dialog. */
const stateIn = (page, name) =>
	page.getByTestId('model-row').filter({ hasText: name }).getByTestId('model-state');

export async function routerSuite({ python, tmp, step }) {
	const dir = join(tmp, 'models');
	mkdirSync(join(dir, 'vision'), { recursive: true });
	const gguf = await smollm2(python);
	symlinkSync(gguf, join(dir, 'smol-a.gguf'));
	symlinkSync(gguf, join(dir, 'smol-b.gguf'));
	symlinkSync(gguf, join(dir, 'vision', 'vision.gguf'));
	writeFileSync(join(dir, 'vision', 'mmproj-vision.gguf'), ''); // never loaded: only its name counts
	let router = null;
	let front = null;
	const host = await modelHost(gguf, 'downloaded-smol.gguf');
	let context = null;
	try {
		router = await startServer({
			python,
			module: 'llama_router',
			log: join(tmp, 'router.log'),
			args: ['--models-dir', dir, '--models-max', '1', '--no-webui', '-c', '2048', '-np', '1'],
			env: { LLAMA_CACHE: join(tmp, 'cache') }
		});
		front = await serveApp(app, router.url);
		let page;
		({ context, page } = await launch(join(tmp, 'router-profile')));
		const requests = [];
		page.on('request', (r) => {
			if (r.url().endsWith('/v1/chat/completions'))
				requests.push({ body: JSON.parse(r.postData() ?? '{}'), headers: r.headers() });
		});
		await routerSteps({ page, url: front.url, step, requests, download: host.url });
	} catch (e) {
		await step('router mode: setup', () => Promise.reject(e));
	} finally {
		await context?.close().catch(() => {});
		await front?.close();
		await host.close();
		await router?.stop();
	}
}

async function routerSteps({ page, url, step, requests, download }) {
	await step('router mode: the model selector lists the models of /models with their status', async () => {
		await page.goto(url);
		const selector = page.getByTestId('model-selector');
		await selector.waitFor();
		await selector.click();
		for (const name of ['smol-a', 'smol-b', 'vision'])
			await page.getByRole('option', { name: new RegExp(`^✓?\\s*${name}`) }).waitFor();
		await page.getByRole('option').first().getByText('unloaded').waitFor();
		await shot(page, 'router-selector.png');
		await page.getByRole('option', { name: /smol-a/ }).click();
		assert.match(await selector.innerText(), /smol-a/);
	});

	await step(
		'router mode: load and unload from the models dialog, statuses live from /models/sse',
		async () => {
			await page.getByRole('button', { name: 'Models', exact: true }).click();
			const dialog = page.getByRole('dialog');
			await dialog
				.getByTestId('model-row')
				.filter({ hasText: 'smol-b' })
				.getByRole('button', { name: 'Load' })
				.click();
			await stateIn(dialog, 'smol-b')
				.getByText(/^(loading|loaded)$/)
				.waitFor();
			await stateIn(dialog, 'smol-b').getByText('loaded', { exact: true }).waitFor({ timeout: 120_000 });
			await shot(page, 'router-models.png');
			await dialog
				.getByTestId('model-row')
				.filter({ hasText: 'smol-b' })
				.getByRole('button', { name: 'Unload' })
				.click();
			await stateIn(dialog, 'smol-b').getByText('unloaded', { exact: true }).waitFor({ timeout: 60_000 });
			await page.keyboard.press('Escape');
		}
	);

	await step('router mode: a message goes to the chosen model, which the router loads', async () => {
		await send(page, 'Hi!');
		await waitForReply(page, 180_000);
		const last = requests.at(-1);
		assert.equal(last.body.model, 'smol-a');
		assert.match(last.headers['x-conversation-id'], /::smol-a$/);
		assert.match(await page.getByTestId('model-selector').innerText(), /\bloaded\b/);
	});

	await step('router mode: switching to a model that cannot take the images asks first', async () => {
		const image = 'data:image/png;base64,iVBORw0KGgo=';
		const conversation = { id: 'img', name: 'A picture', currentLeaf: 'u1', createdAt: 1, updatedAt: 1 };
		const messages = [
			{
				id: 'u1',
				convId: 'img',
				parent: null,
				role: 'user',
				content: 'What is this?',
				attachments: [{ name: 'cat.png', kind: 'image', content: image }],
				createdAt: 1
			}
		];
		const data = {
			format: 'llama-webui/conversations',
			version: 1,
			conversations: [{ conversation, messages }]
		};
		await page.getByTestId('import-input').setInputFiles({
			name: 'img.json',
			mimeType: 'application/json',
			buffer: Buffer.from(JSON.stringify(data))
		});
		await page.getByRole('button', { name: 'A picture', exact: true }).click();
		const selector = page.getByTestId('model-selector');
		await selector.click();
		await page.getByRole('option', { name: /vision/ }).click(); // takes images: no question
		assert.match(await selector.innerText(), /vision/);
		await selector.click();
		await page.getByRole('option', { name: /smol-b/ }).click();
		const ask = page.getByRole('alertdialog');
		await ask.getByText('image attachments').waitFor();
		await shot(page, 'router-modality-warning.png');
		await ask.getByRole('button', { name: 'Cancel' }).click();
		assert.match(await selector.innerText(), /vision/); // unchanged
		await selector.click();
		await page.getByRole('option', { name: /smol-b/ }).click();
		await ask.getByRole('button', { name: 'Switch anyway' }).click();
		assert.match(await selector.innerText(), /smol-b/);
	});

	await step(
		'router mode: a model downloads by URL with progress, then is deleted from the cache',
		async () => {
			await page.getByRole('button', { name: 'Models', exact: true }).click();
			const dialog = page.getByRole('dialog');
			await dialog.getByLabel('Model to download').fill(download);
			await dialog.getByRole('button', { name: 'Download' }).click();
			const row = dialog.getByTestId('model-row').filter({ hasText: 'downloaded-smol' });
			await row.getByTestId('download-progress').waitFor();
			await row
				.getByTestId('download-bytes')
				.getByText(/ of 93\.8 MiB/)
				.waitFor();
			await row.getByTestId('model-state').getByText('downloading').waitFor();
			await shot(page, 'router-download.png');
			// finished: a cache entry like any other, which can be deleted
			await row
				.getByTestId('model-state')
				.getByText('unloaded', { exact: true })
				.waitFor({ timeout: 60_000 });
			assert.equal(await row.getByTestId('download-progress').count(), 0);
			await row.getByRole('button', { name: /^Delete/ }).click();
			await page.getByRole('alertdialog').getByRole('button', { name: 'Delete' }).click();
			await row.waitFor({ state: 'detached' });
			await page.keyboard.press('Escape');
		}
	);
}
