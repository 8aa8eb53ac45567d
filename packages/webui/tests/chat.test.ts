import { beforeEach, describe, expect, it } from 'vitest';
import { ApiError, type ApiClient, type ChatDelta, type ChatMessage } from '../src/lib/services/api';
import { ChatDatabase } from '../src/lib/services/db';
import { ChatController } from '../src/lib/stores/chat.svelte';
import { ConversationStore } from '../src/lib/stores/conversations.svelte';
import { SettingsStore } from '../src/lib/stores/settings.svelte';

/** A stand-in for the HTTP client: replies with fixed deltas, records what was sent. */
class FakeApi {
	sent: ChatMessage[][] = [];
	constructor(
		public deltas: ChatDelta[],
		public fail?: ApiError
	) {}
	async *chat(messages: ChatMessage[], _params: unknown, signal?: AbortSignal): AsyncGenerator<ChatDelta> {
		this.sent.push(messages);
		if (this.fail) throw this.fail;
		for (const d of this.deltas) {
			await new Promise((r) => setTimeout(r, 1));
			if (signal?.aborted) throw new DOMException('aborted', 'AbortError');
			yield d;
		}
	}
}

let n = 0;
let convs: ConversationStore;
let settings: SettingsStore;

beforeEach(async () => {
	convs = new ConversationStore(new ChatDatabase(`chat-${n++}`));
	settings = new SettingsStore(undefined);
});

const controller = (api: FakeApi) => new ChatController(convs, settings, api as unknown as ApiClient);

describe('ChatController', () => {
	it('streams a reply with its reasoning and speed into a new conversation', async () => {
		const api = new FakeApi([
			{ reasoning: 'Think.' },
			{ content: 'Hel' },
			{ content: 'lo', timings: { predicted_per_second: 9 } }
		]);
		settings.update({ systemPrompt: 'Be kind.' });
		await controller(api).send('Hi');
		expect(convs.thread.map((m) => [m.role, m.content])).toEqual([
			['user', 'Hi'],
			['assistant', 'Hello']
		]);
		expect(convs.thread[1].reasoning).toBe('Think.');
		expect(convs.thread[1].timings?.predicted_per_second).toBe(9);
		expect(api.sent[0]).toEqual([
			{ role: 'system', content: 'Be kind.' },
			{ role: 'user', content: 'Hi' }
		]);
	});

	it('stops mid-stream and keeps what arrived', async () => {
		const api = new FakeApi(Array.from({ length: 50 }, () => ({ content: 'x' })));
		const chat = controller(api);
		const sending = chat.send('Long, please');
		while (!convs.thread[1]?.content) await new Promise((r) => setTimeout(r, 1));
		chat.stop();
		await sending;
		const reply = convs.thread[1];
		expect(reply.status).toBe('stopped');
		expect(reply.content.length).toBeGreaterThan(0);
		expect(reply.content.length).toBeLessThan(50);
		expect(chat.streaming).toBeNull();
	});

	it('regenerates and edits as new branches', async () => {
		const api = new FakeApi([{ content: 'A' }]);
		const chat = controller(api);
		await chat.send('Q');
		const [q, a] = convs.thread;
		api.deltas = [{ content: 'B' }];
		await chat.regenerate(a.id);
		expect(convs.thread.map((m) => m.content)).toEqual(['Q', 'B']);
		expect(convs.versions(convs.thread[1].id).ids).toHaveLength(2);
		api.deltas = [{ content: 'C' }];
		await chat.edit(q.id, 'Q2');
		expect(convs.thread.map((m) => m.content)).toEqual(['Q2', 'C']);
		await convs.switchTo(q.id);
		expect(convs.thread.map((m) => m.content)).toEqual(['Q', 'B']);
	});

	it('reports errors such as a full context', async () => {
		const api = new FakeApi([], new ApiError('context', 'too long', 400));
		const chat = controller(api);
		await chat.send('Q');
		expect(chat.error).toBeInstanceOf(ApiError);
		expect((chat.error as ApiError).kind).toBe('context');
		expect(convs.thread[1].status).toBe('error');
	});
});
