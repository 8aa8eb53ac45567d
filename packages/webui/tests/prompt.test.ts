import { describe, expect, it } from 'vitest';
import { toRequestMessages } from '../src/lib/services/prompt';
import { fileKind } from '../src/lib/services/files';
import { requestParams } from '../src/lib/stores/chat.svelte';
import { FALLBACK_SAMPLING } from '../src/lib/stores/settings.svelte';
import type { Message } from '../src/lib/types';

const base = { convId: 'c', createdAt: 0 };

describe('toRequestMessages', () => {
	it('puts the system prompt first and file text before the question', () => {
		const thread: Message[] = [
			{
				...base,
				id: '1',
				parent: null,
				role: 'user',
				content: 'Summarize',
				attachments: [{ name: 'a.txt', kind: 'text', content: 'hello' }]
			}
		];
		const out = toRequestMessages(thread, 'Be brief.');
		expect(out[0]).toEqual({ role: 'system', content: 'Be brief.' });
		expect(out[1].content).toBe('File a.txt:\n```\nhello\n```\n\nSummarize');
	});

	it('sends images as image_url parts', () => {
		const thread: Message[] = [
			{
				...base,
				id: '1',
				parent: null,
				role: 'user',
				content: 'What is it?',
				attachments: [{ name: 'x.png', kind: 'image', content: 'data:image/png;base64,AA' }]
			}
		];
		expect(toRequestMessages(thread, '')[0].content).toEqual([
			{ type: 'image_url', image_url: { url: 'data:image/png;base64,AA' } },
			{ type: 'text', text: 'What is it?' }
		]);
	});
});

describe('fileKind', () => {
	it('tells text, PDF and image files apart', () => {
		expect(fileKind('notes.md', '')).toBe('text');
		expect(fileKind('paper.pdf', 'application/pdf')).toBe('pdf');
		expect(fileKind('cat.png', 'image/png')).toBe('image');
		expect(fileKind('app.exe', 'application/octet-stream')).toBe('unsupported');
	});
});

describe('requestParams', () => {
	it('leaves out an unlimited max_tokens', () => {
		expect(requestParams(FALLBACK_SAMPLING)).not.toHaveProperty('max_tokens');
		expect(requestParams({ ...FALLBACK_SAMPLING, max_tokens: 64 }).max_tokens).toBe(64);
	});
});
