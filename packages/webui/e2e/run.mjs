// Browser tests of the web UI: headless Chromium (Debian's package, driven by playwright-core) against a
// real llama-server with the bundled SmolLM2 model and an API key.
//
//   node e2e/run.mjs                       # starts `python3 -m llama_server` itself
//   E2E_PYTHON=/path/to/python node e2e/run.mjs
//   E2E_URL=http://127.0.0.1:8080 E2E_KEY=k node e2e/run.mjs   # an already running server
//   E2E_SCREENSHOTS=0 ...                  # do not rewrite screenshots/
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { startServer } from './server.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const shots = join(here, '..', 'screenshots');
const tmp = mkdtempSync(join(tmpdir(), 'llama-webui-e2e-'));
const KEY = process.env.E2E_KEY ?? 'e2e-secret-key';
const saveShots = process.env.E2E_SCREENSHOTS !== '0';

let server = null;
let context = null;
let passed = 0;
const failed = [];

async function step(name, fn) {
	const t0 = Date.now();
	try {
		await fn();
		passed++;
		console.log(`ok   ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
	} catch (e) {
		failed.push(name);
		console.log(
			`FAIL ${name}\n     ${String(e?.stack ?? e)
				.split('\n')
				.slice(0, 6)
				.join('\n     ')}`
		);
		if (context)
			await context
				.pages()[0]
				?.screenshot({ path: join(tmp, `fail-${passed + failed.length}.png`) })
				.catch(() => {});
	}
}

async function shot(page, name) {
	if (saveShots) await page.screenshot({ path: join(shots, name) });
}

/** The text of the last reply once its stream has ended (the Send button is back). */
async function waitForReply(page, timeout = 120_000) {
	await page.locator('[data-testid="chat"][data-busy="false"]').waitFor({ timeout });
	return (await page.getByTestId('message').last().getByTestId('message-content').innerText()).trim();
}

/** Type and send a message; returns once its request has left (the reply is streaming from then on). */
async function send(page, text) {
	await page.getByLabel('Message', { exact: true }).fill(text);
	const request = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions'));
	await page.keyboard.press('Enter');
	await request;
}

async function main() {
	let url = process.env.E2E_URL;
	if (!url) {
		const python = process.env.E2E_PYTHON ?? 'python3';
		const log = join(tmp, 'server.log');
		console.log(`starting llama-server (${python}), log: ${log}`);
		server = await startServer({ python, log, args: ['--api-key', KEY, '-c', '4096', '-np', '2'] });
		url = server.url;
	}
	context = await chromium.launchPersistentContext(join(tmp, 'profile'), {
		executablePath: process.env.E2E_CHROMIUM ?? '/usr/bin/chromium',
		headless: false, // the flags below make it headless, as given
		args: [
			'--headless',
			'--no-sandbox',
			'--disable-gpu',
			'--disable-quic',
			'--no-first-run',
			'--disable-background-networking',
			'--disable-component-update',
			'--disable-sync'
		],
		viewport: { width: 1280, height: 800 },
		colorScheme: 'light'
	});
	const page = context.pages()[0] ?? (await context.newPage());
	page.setDefaultTimeout(30_000);
	const requests = [];
	page.on('request', (r) => {
		if (r.url().endsWith('/v1/chat/completions')) requests.push(JSON.parse(r.postData() ?? '{}'));
	});

	await step('the app asks for the API key, rejects a wrong one and accepts the right one', async () => {
		await page.goto(url);
		await page.getByRole('heading', { name: 'API key required' }).waitFor();
		await shot(page, 'api-key.png');
		await page.getByPlaceholder('API key').fill('wrong-key');
		await page.getByRole('button', { name: 'Connect' }).click();
		await page.getByText('rejected the API key').waitFor();
		await page.getByPlaceholder('API key').fill(KEY);
		await page.getByRole('button', { name: 'Connect' }).click();
		await page.getByLabel('Message', { exact: true }).waitFor();
	});

	await step(
		'a setting changes the request, survives a reload and resets to the server default',
		async () => {
			await page.getByRole('button', { name: 'Settings' }).click();
			const dialog = page.getByRole('dialog');
			await dialog.getByText('server default: 40').waitFor(); // top_k from /props
			const maxTokens = dialog.locator('input[name="max_tokens"]');
			await maxTokens.fill('40');
			await maxTokens.press('Tab');
			const topK = dialog.locator('input[name="top_k"]');
			await topK.fill('7');
			await topK.press('Tab');
			await dialog.getByText('(changed)').first().waitFor();
			await shot(page, 'settings.png');
			await page.reload();
			await page.getByRole('button', { name: 'Settings' }).click();
			assert.equal(await page.getByRole('dialog').locator('input[name="top_k"]').inputValue(), '7');
			await page.getByRole('dialog').getByRole('button', { name: 'Reset to server defaults' }).click();
			assert.equal(await page.getByRole('dialog').locator('input[name="top_k"]').inputValue(), '40');
			await maxTokens.fill('40'); // keep replies short for the tests below
			await maxTokens.press('Tab');
			await page.keyboard.press('Escape');
			await page.getByRole('dialog').waitFor({ state: 'hidden' });
		}
	);

	await step('a message gets a streamed reply with tokens per second', async () => {
		await send(page, 'What is the capital of France?');
		await page.getByRole('button', { name: 'Stop' }).waitFor(); // streaming
		const reply = await waitForReply(page);
		assert.ok(reply.length > 0, 'empty reply');
		assert.match(await page.getByTestId('speed').last().innerText(), /tokens\/s/);
		assert.equal(requests.at(-1).max_tokens, 40);
		assert.equal(requests.at(-1).stream, true);
		assert.ok(!('top_k' in requests.at(-1)) || requests.at(-1).top_k === 40);
		await page.getByRole('button', { name: 'What is the capital of France?', exact: true }).waitFor(); // named in the list
		await page.mouse.move(0, 0);
		await shot(page, 'chat-light.png');
	});

	await step('a reply can be stopped mid-stream', async () => {
		await send(page, 'Write a long poem about llamas in the mountains.');
		await page.getByRole('button', { name: 'Stop' }).waitFor();
		const last = page.getByTestId('message').nth(3).getByTestId('message-content');
		await last.locator('.markdown').waitFor(); // the first tokens of the new reply arrived
		await page.getByRole('button', { name: 'Stop' }).click();
		await page.getByTestId('stopped').waitFor();
		await page.getByRole('button', { name: 'Send' }).waitFor();
		assert.ok((await last.innerText()).length > 0);
	});

	await step('editing a message makes a branch the user can switch back from', async () => {
		const first = page.getByTestId('message').first();
		await first.hover();
		await first.getByRole('button', { name: 'Edit' }).click();
		await first.getByLabel('Edit message').fill('What is the capital of Italy?');
		const request = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions'));
		await first.getByRole('button', { name: 'Send' }).click();
		await request;
		await page.getByTestId('message').first().getByText('What is the capital of Italy?').waitFor();
		await waitForReply(page);
		assert.equal(await page.getByTestId('message').count(), 2); // the new branch: question and reply
		const position = page.getByTestId('message').first().getByTestId('branch-position');
		assert.equal(await position.innerText(), '2/2');
		await page.getByTestId('message').first().getByRole('button', { name: 'Previous version' }).click();
		await position.getByText('1/2', { exact: true }).waitFor();
		await page.getByTestId('message').first().getByText('What is the capital of France?').waitFor();
		assert.equal(await page.getByTestId('message').count(), 4); // the old branch is whole again
	});

	await step('after a reload the conversation is listed and opens with its messages', async () => {
		await page.reload();
		await page.getByLabel('Message', { exact: true }).waitFor();
		const item = page
			.getByTestId('conversation-list')
			.getByRole('button', { name: 'What is the capital of France?', exact: true });
		await item.waitFor();
		await page.getByTestId('new-conversation').click();
		await page.getByText('How can I help?').waitFor();
		await item.click();
		await page.getByTestId('message').first().getByText('What is the capital of France?').waitFor();
		assert.equal(await page.getByTestId('message').count(), 4);
	});

	await step('the theme switches to dark and stays dark after a reload', async () => {
		await page.getByTestId('theme-toggle').click();
		assert.ok(await page.evaluate(() => document.documentElement.classList.contains('dark')));
		await page.reload();
		await page.getByTestId('message').first().waitFor();
		assert.ok(await page.evaluate(() => document.documentElement.classList.contains('dark')));
		await page.mouse.move(0, 0);
		await shot(page, 'chat-dark.png');
	});

	await step('on a phone-sized screen the conversation list opens from the menu', async () => {
		await page.setViewportSize({ width: 390, height: 844 });
		await page.getByRole('button', { name: 'Conversations' }).click();
		await page.getByTestId('new-conversation').waitFor();
		await page.waitForTimeout(300); // the list slides in
		await shot(page, 'mobile-list.png');
		await page
			.getByTestId('conversation-list')
			.getByRole('button', { name: 'What is the capital of France?', exact: true })
			.click();
		await page.getByRole('button', { name: 'Close the conversation list' }).waitFor({ state: 'detached' });
		await page.getByTestId('message').first().waitFor();
		await page.waitForTimeout(300); // the list slides away
		await shot(page, 'mobile-chat.png');
		await page.setViewportSize({ width: 1280, height: 800 });
	});

	await step('conversations export to JSON and import back after a deletion', async () => {
		const list = page.getByTestId('conversation-list');
		const [download] = await Promise.all([
			page.waitForEvent('download'),
			page.getByRole('button', { name: 'Export all' }).click()
		]);
		const file = join(tmp, 'conversations.json');
		await download.saveAs(file);
		const data = JSON.parse(readFileSync(file, 'utf8'));
		assert.equal(data.conversations.length, 1);
		assert.equal(data.conversations[0].messages.length, 6); // both branches
		page.once('dialog', (d) => d.accept());
		await list.getByRole('button', { name: 'Delete What is the capital of France?' }).click();
		await page.getByText('No conversations yet').waitFor();
		await page.getByTestId('import-input').setInputFiles(file);
		await page.getByText('Imported 1 new, 0 as copies, 0 already there.').waitFor();
		await list.getByRole('button', { name: 'What is the capital of France?', exact: true }).click();
		await page.getByTestId('message').nth(3).waitFor();
	});

	await step('an attached text file and the system prompt are sent; images are refused', async () => {
		await page.getByRole('button', { name: 'Settings' }).click();
		const prompt = page.getByRole('dialog').getByLabel('System prompt');
		await prompt.fill('You are terse.');
		await prompt.press('Tab');
		await page.keyboard.press('Escape');
		await page.getByTestId('new-conversation').click();
		const input = page.getByTestId('file-input');
		await input.setInputFiles({
			name: 'cat.png',
			mimeType: 'image/png',
			buffer: Buffer.from([137, 80, 78, 71])
		});
		await page.getByText('this model does not take images').waitFor();
		await input.setInputFiles({
			name: 'notes.txt',
			mimeType: 'text/plain',
			buffer: Buffer.from('Llamas hum.')
		});
		await page.getByTestId('attachment').getByText('notes.txt').waitFor();
		await send(page, 'Summarize the file.');
		await waitForReply(page);
		const req = requests.at(-1);
		assert.deepEqual(req.messages[0], { role: 'system', content: 'You are terse.' });
		assert.match(req.messages[1].content, /notes\.txt[\s\S]*Llamas hum\.[\s\S]*Summarize the file\./);
	});

	await step('a message too long for the context gives a clear message', async () => {
		await send(page, 'llama '.repeat(3000));
		await page.getByTestId('error').getByText("too long for the model's context").waitFor();
		await shot(page, 'context-full.png');
	});

	if (server) {
		await step('a stopped server gives a clear message', async () => {
			await server.stop();
			await send(page, 'Are you there?');
			await page.getByTestId('error').getByText('Cannot reach the server').waitFor();
		});
	}
}

try {
	await main();
} catch (e) {
	failed.push('setup');
	console.log(`FAIL setup: ${e?.stack ?? e}`);
} finally {
	await context?.close().catch(() => {});
	await server?.stop();
	if (!failed.length) rmSync(tmp, { recursive: true, force: true });
	else console.log(`kept ${tmp} (server log, failure screenshots)`);
}
console.log(`\n${passed} passed, ${failed.length} failed`);
process.exit(failed.length ? 1 : 0);
