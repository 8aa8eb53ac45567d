// Browser tests of the web UI: headless Chromium (Debian's package, driven by playwright-core) against a
// real llama-server with the bundled SmolLM2 model, an API key and its built-in tools (working in a
// scratch folder).
//
//   node e2e/run.mjs                       # starts `python3 -m llama_server` itself
//   E2E_PYTHON=/path/to/python node e2e/run.mjs
//   E2E_URL=http://127.0.0.1:8080 E2E_KEY=k node e2e/run.mjs   # an already running server
//   E2E_SCREENSHOTS=0 ...                  # do not rewrite screenshots/
//   E2E_SUITES=router ...                  # only some suites (default: chat,router,store; router mode
//                                          # needs llama-router; router and store are left out with E2E_URL)
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { launch, results, send, shot, step as runStep, waitForReply } from './harness.mjs';
import { startRelay } from './proxy.mjs';
import { routerSuite } from './router.mjs';
import { storeSuite } from './store.mjs';
import { startServer } from './server.mjs';

const tmp = mkdtempSync(join(tmpdir(), 'llama-webui-e2e-'));
const KEY = process.env.E2E_KEY ?? 'e2e-secret-key';
const python = process.env.E2E_PYTHON ?? 'python3';
const work = join(tmp, 'work'); // the tools' working folder
mkdirSync(work);

let server = null;
let relay = null; // the browser talks to the server through it
let context = null;
const step = (name, fn) => runStep(name, fn, tmp);
const suites = (process.env.E2E_SUITES ?? 'chat,router,store').split(',');

async function main() {
	let url = process.env.E2E_URL;
	if (!url) {
		const log = join(tmp, 'server.log');
		console.log(`starting llama-server (${python}), log: ${log}`);
		const args = ['--api-key', KEY, '-c', '4096', '-np', '2', '--tools', 'all'];
		server = await startServer({ python, log, args, cwd: work });
		url = server.url;
	}
	relay = await startRelay(url);
	url = relay.url;
	let page;
	({ context, page } = await launch(join(tmp, 'profile')));
	const requests = [];
	const replays = []; // GET /v1/stream URLs
	page.on('request', (r) => {
		if (r.url().endsWith('/v1/chat/completions')) requests.push(JSON.parse(r.postData() ?? '{}'));
		if (r.url().includes('/v1/stream?') && r.method() === 'GET') replays.push(r.url());
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
		await list.getByRole('button', { name: 'Delete What is the capital of France?' }).click();
		await page.getByRole('alertdialog').getByRole('button', { name: 'Delete' }).click();
		await page.getByText('No conversations yet').waitFor();
		await page.getByTestId('import-input').setInputFiles(file);
		await page.getByText('Imported 1 new, 0 as copies, 0 already there.').waitFor();
		await list.getByRole('button', { name: 'What is the capital of France?', exact: true }).click();
		await page.getByTestId('message').nth(3).waitFor();
	});

	await step('a reload mid-reply re-attaches to the generation and the reply finishes in place', async () => {
		await setMaxTokens(page, '400'); // long enough to be still generating when the page reloads
		await page.getByTestId('new-conversation').click();
		await send(page, 'Tell me about the moon.');
		const reply = page.getByTestId('message').nth(1).getByTestId('message-content');
		await reply.locator('.markdown').waitFor(); // the first tokens arrived
		await page.waitForTimeout(600); // saved with its byte offset
		const before = (await reply.innerText()).trim();
		const sent = requests.length;
		await page.reload();
		await page.getByTestId('message').nth(1).waitFor();
		const reply2 = page.getByTestId('message').nth(1).getByTestId('message-content');
		await page.getByTestId('message').nth(1).getByTestId('resumed').waitFor(); // re-attached
		const text = await waitForReply(page);
		assert.equal(requests.length, sent, 'the question was not asked again');
		assert.ok(replays.length > 0, 'no GET /v1/stream');
		assert.match(replays.at(-1), /from=[1-9]/); // from the saved offset, not from the start
		assert.ok(text.startsWith(before.slice(0, 20)) && text.length > before.length, `${before} / ${text}`);
		assert.equal(await reply2.getByTestId('stopped').count(), 0);
		assert.equal(await page.getByTestId('message').count(), 2); // in place: no second reply
		await page.getByTestId('message').nth(1).getByTestId('resumed').waitFor();
		await page.mouse.move(0, 0);
		await shot(page, 'resumed-after-reload.png');
		await setMaxTokens(page, '40');
	});

	await step('a dropped connection mid-reply reconnects and the reply finishes', async () => {
		await send(page, 'And about the sun?');
		const reply = page.getByTestId('message').nth(3).getByTestId('message-content');
		await reply.locator('.markdown').waitFor();
		const n = replays.length;
		relay.drop(); // the connection dies mid-reply
		const text = await waitForReply(page);
		assert.ok(replays.length > n, 'no replay after the drop');
		assert.ok(text.length > 0);
		assert.equal(await reply.getByTestId('stopped').count(), 0);
		assert.equal(await page.getByTestId('error').count(), 0);
		await page.getByTestId('message').nth(3).getByTestId('resumed').waitFor();
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

	await step('a tool call asks for permission, runs on the server and its result goes back', async () => {
		// a few examples of the call format, so the small model answers with a call
		const examples = [
			['Write hello to a.txt', 'a.txt', 'hello'],
			['Write llama to b.txt', 'b.txt', 'llama']
		];
		const messages = [];
		let parent = null;
		examples.forEach(([q, path, content], i) => {
			const call = JSON.stringify({ name: 'write_file', arguments: { path, content } });
			for (const [role, text] of [
				['user', q],
				['assistant', `<tool_call>${call}</tool_call>`]
			]) {
				const id = `m${i}${role}`;
				messages.push({ id, convId: 'tools', parent, role, content: text, createdAt: messages.length + 1 });
				parent = id;
			}
		});
		const conversation = { id: 'tools', name: 'Files', currentLeaf: parent, createdAt: 1, updatedAt: 1 };
		const file = join(tmp, 'tools.json');
		writeFileSync(
			file,
			JSON.stringify({
				format: 'llama-webui/conversations',
				version: 1,
				conversations: [{ conversation, messages }]
			})
		);
		await page.getByTestId('import-input').setInputFiles(file);
		await page.getByRole('button', { name: 'Files', exact: true }).click();
		await page.getByRole('button', { name: 'Settings' }).click();
		const dialog = page.getByRole('dialog');
		await dialog.getByLabel('System prompt').fill('You call tools. Answer only with a tool call.');
		await dialog.getByLabel('System prompt').press('Tab');
		await dialog.locator('input[name="temperature"]').fill('0');
		await dialog.locator('input[name="temperature"]').press('Tab');
		await page.keyboard.press('Escape');
		await send(page, 'Write alpaca to c.txt');
		const ask = page.getByTestId('permission');
		await ask.waitFor({ timeout: 120_000 });
		assert.ok(requests.at(-1).tools.some((t) => t.function.name === 'write_file'));
		const args = JSON.parse(await ask.getByTestId('permission-args').innerText());
		assert.equal(args.content, 'alpaca');
		await shot(page, 'tool-permission.png');
		assert.ok(!existsSync(join(work, args.path)), 'ran before it was allowed');
		const asked = requests.length;
		await ask.getByRole('button', { name: 'Allow', exact: true }).click();
		await page.getByTestId('tool-result').first().waitFor();
		assert.equal(readFileSync(join(work, args.path), 'utf8'), 'alpaca');
		// the result goes back to the model as a tool message, and the loop ends with its answer
		const idle = page.locator('[data-testid="chat"][data-busy="false"]');
		await idle.or(ask).waitFor({ timeout: 180_000 });
		if (await ask.count()) {
			// another call: the user stops the loop at its prompt
			await page.getByRole('button', { name: 'Stop' }).click();
			await idle.waitFor();
		}
		assert.ok(requests.length > asked, 'the result was not sent back');
		const next = requests[asked].messages;
		assert.equal(next.at(-1).role, 'tool');
		assert.match(next.at(-1).content, /file written successfully/);
		assert.equal(next.at(-2).tool_calls[0].function.name, 'write_file');
		assert.equal(await ask.count(), 0);
		await page.getByTestId('tool-result').first().click(); // open the result
		await page.mouse.move(0, 0);
		await shot(page, 'tool-call.png');
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
	if (suites.includes('chat')) await main();
} catch (e) {
	results.failed.push('setup');
	console.log(`FAIL setup: ${e?.stack ?? e}`);
} finally {
	await context?.close().catch(() => {});
	await relay?.close();
	await server?.stop();
}
if (suites.includes('router') && !process.env.E2E_URL) await routerSuite({ python, tmp, step });
if (suites.includes('store') && !process.env.E2E_URL) await storeSuite({ python, tmp, step });
if (!results.failed.length) rmSync(tmp, { recursive: true, force: true });
else console.log(`kept ${tmp} (server logs, failure screenshots)`);
console.log(`\n${results.passed} passed, ${results.failed.length} failed`);
process.exit(results.failed.length ? 1 : 0);

async function setMaxTokens(page, value) {
	await page.getByRole('button', { name: 'Settings' }).click();
	const maxTokens = page.getByRole('dialog').locator('input[name="max_tokens"]');
	await maxTokens.fill(value);
	await maxTokens.press('Tab');
	await page.keyboard.press('Escape');
	await page.getByRole('dialog').waitFor({ state: 'hidden' });
}
