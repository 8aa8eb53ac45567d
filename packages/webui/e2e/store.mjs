// Browser tests of chats kept on the server: a real llama-server started with `--store` (an SQLite file)
// and two browser profiles (two separate IndexedDBs), so what the second one shows can only have come from
// the server. The first makes a conversation with an attachment and a branch; the second sees all of it,
// continues it, and the first sees that after a reload; a deletion reaches both.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { launch, send, waitForReply } from './harness.mjs';
import { startServer } from './server.mjs';

async function shortReplies(page) {
	await page.getByRole('button', { name: 'Settings' }).click();
	const maxTokens = page.getByRole('dialog').locator('input[name="max_tokens"]');
	await maxTokens.fill('16');
	await maxTokens.press('Tab');
	await page.keyboard.press('Escape');
	await page.getByRole('dialog').waitFor({ state: 'hidden' });
}

const listed = (page, name) =>
	page.getByTestId('conversation-list').getByRole('button', { name, exact: true });

export async function storeSuite({ python, tmp, step }) {
	const server = await startServer({
		python,
		log: join(tmp, 'store-server.log'),
		args: ['-c', '2048', '-np', '2', '--store', join(tmp, 'chats.db')],
		cwd: tmp
	});
	const browsers = [];
	try {
		const a = await launch(join(tmp, 'profile-a'));
		browsers.push(a.context);
		const b = await launch(join(tmp, 'profile-b'));
		browsers.push(b.context);
		for (const { page } of [a, b]) {
			await page.goto(server.url);
			await page.getByLabel('Message', { exact: true }).waitFor();
			await shortReplies(page);
		}

		await step('a chat made in one browser, with an attachment and a branch, shows in another', async () => {
			const page = a.page;
			await page.getByTestId('file-input').setInputFiles({
				name: 'notes.txt',
				mimeType: 'text/plain',
				buffer: Buffer.from('Llamas hum.')
			});
			await send(page, 'Summarize the file.');
			await waitForReply(page);
			const first = page.getByTestId('message').first();
			await first.hover();
			await first.getByRole('button', { name: 'Edit' }).click();
			await first.getByLabel('Edit message').fill('Summarize the file in French.');
			await first.getByRole('button', { name: 'Send' }).click();
			await page.getByTestId('message').first().getByText('Summarize the file in French.').waitFor();
			const reply = await waitForReply(page);

			await b.page.reload();
			await listed(b.page, 'Summarize the file.').click();
			const other = b.page.getByTestId('message');
			await other.first().getByText('Summarize the file in French.').waitFor(); // the branch on screen
			assert.equal(await other.count(), 2);
			assert.equal((await other.last().getByTestId('message-content').innerText()).trim(), reply);
			assert.equal(await other.first().getByTestId('branch-position').innerText(), '2/2');
			await other.first().getByRole('button', { name: 'Previous version' }).click();
			await other.first().getByText('Summarize the file.', { exact: true }).waitFor();
			// the attachment came too: shown on the message, and sent again when the branch is continued
			await other.first().getByTestId('message-content').getByText('notes.txt').waitFor();
		});

		await step('the second browser continues it and the first sees the new turn after a reload', async () => {
			await send(b.page, 'Thanks!');
			const reply = await waitForReply(b.page);
			await a.page.reload();
			await listed(a.page, 'Summarize the file.').click();
			await a.page.getByTestId('message').getByText('Thanks!', { exact: true }).waitFor();
			const last = a.page.getByTestId('message').last().getByTestId('message-content');
			assert.equal((await last.innerText()).trim(), reply);
		});

		await step('a conversation deleted in one browser is gone from the other', async () => {
			const item = listed(a.page, 'Summarize the file.');
			await item.hover();
			await a.page.getByRole('button', { name: 'Delete Summarize the file.' }).click();
			await a.page.getByRole('alertdialog').getByRole('button', { name: 'Delete' }).click();
			await item.waitFor({ state: 'detached' });
			await b.page.reload();
			await b.page.getByLabel('Message', { exact: true }).waitFor();
			assert.equal(await listed(b.page, 'Summarize the file.').count(), 0);
		});
	} finally {
		for (const c of browsers) await c.close().catch(() => {});
		await server.stop();
	}
}
