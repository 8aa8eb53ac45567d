// What the browser test suites share: steps that count and report, screenshots, the browser, chat helpers.
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const shots = join(here, '..', 'screenshots');
const saveShots = process.env.E2E_SCREENSHOTS !== '0';

export const results = { passed: 0, failed: [] };
/** the browser context a failing step screenshots (set by `launch`) */
let current = null;

/** Run one named test; a failure is reported (with a screenshot in `tmp`) and the suite goes on. */
export async function step(name, fn, tmp) {
	const t0 = Date.now();
	try {
		await fn();
		results.passed++;
		console.log(`ok   ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
	} catch (e) {
		results.failed.push(name);
		console.log(
			`FAIL ${name}\n     ${String(e?.stack ?? e)
				.split('\n')
				.slice(0, 6)
				.join('\n     ')}`
		);
		const n = results.passed + results.failed.length;
		if (current && tmp)
			await current
				.pages()[0]
				?.screenshot({ path: join(tmp, `fail-${n}.png`) })
				.catch(() => {});
	}
}

/** Save a screenshot into packages/webui/screenshots (unless E2E_SCREENSHOTS=0). */
export async function shot(page, name) {
	if (saveShots) await page.screenshot({ path: join(shots, name) });
}

/** Headless Chromium (Debian's) with its own profile folder; returns the context and its page. */
export async function launch(profile) {
	const context = await chromium.launchPersistentContext(profile, {
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
	current = context;
	const page = context.pages()[0] ?? (await context.newPage());
	page.setDefaultTimeout(30_000);
	return { context, page };
}

/** The text of the last reply once its stream has ended (the Send button is back). */
export async function waitForReply(page, timeout = 120_000) {
	await page.locator('[data-testid="chat"][data-busy="false"]').waitFor({ timeout });
	return (await page.getByTestId('message').last().getByTestId('message-content').innerText()).trim();
}

/** Type and send a message; returns once its request has left (the reply is streaming from then on). */
export async function send(page, text) {
	await page.getByLabel('Message', { exact: true }).fill(text);
	const request = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions'));
	await page.keyboard.press('Enter');
	return request;
}
