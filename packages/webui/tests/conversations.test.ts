import { beforeEach, describe, expect, it } from 'vitest';
import { ChatDatabase } from '../src/lib/services/db';
import { parseExport, planImport } from '../src/lib/services/transfer';
import { ConversationStore } from '../src/lib/stores/conversations.svelte';

let n = 0;
let store: ConversationStore;

beforeEach(async () => {
	store = new ConversationStore(new ChatDatabase(`test-${n++}`));
	await store.load();
});

describe('ConversationStore', () => {
	it('creates, names from the first message, renames and deletes', async () => {
		const c = await store.create();
		await store.add('user', 'What is a llama?\nTell me.', null);
		expect(store.list[0].name).toBe('What is a llama?');
		await store.rename(c.id, 'Llamas');
		expect(store.active?.name).toBe('Llamas');
		await store.remove(c.id);
		expect(store.list).toEqual([]);
		expect(store.activeId).toBeNull();
		expect(await store.db.messages.count()).toBe(0);
	});

	it('survives a reload (a new store on the same database)', async () => {
		const c = await store.create();
		const u = await store.add('user', 'Hi', null);
		const a = await store.add('assistant', '', u.id);
		store.patch(a.id, { content: 'Hello!' });
		await store.save(a.id);
		const again = new ConversationStore(store.db);
		await again.load();
		await again.open(c.id);
		expect(again.thread.map((m) => m.content)).toEqual(['Hi', 'Hello!']);
	});

	it('stores attachments with their message', async () => {
		const c = await store.create();
		await store.add('user', 'Read this', null, {
			attachments: [{ name: 'a.txt', kind: 'text', content: 'hello' }]
		});
		const again = new ConversationStore(store.db);
		await again.load();
		await again.open(c.id);
		expect(again.thread[0].attachments).toEqual([{ name: 'a.txt', kind: 'text', content: 'hello' }]);
	});

	it('keeps edits as branches to switch between', async () => {
		await store.create();
		const u1 = await store.add('user', 'first', null);
		const a1 = await store.add('assistant', 'reply 1', u1.id);
		const u2 = await store.add('user', 'edited', null); // an edit: a sibling of u1
		await store.add('assistant', 'reply 2', u2.id);
		expect(store.thread.map((m) => m.content)).toEqual(['edited', 'reply 2']);
		expect(store.versions(u2.id)).toEqual({ ids: [u1.id, u2.id], index: 1 });
		await store.switchTo(u1.id);
		expect(store.thread.map((m) => m.content)).toEqual(['first', 'reply 1']);
		expect(store.active?.currentLeaf).toBe(a1.id);
	});

	it('searches names and message text', async () => {
		await store.create('Cooking');
		await store.add('user', 'How long to boil an egg?', null);
		await store.create('Travel');
		await store.search('egg');
		expect(store.visible.map((c) => c.name)).toEqual(['Cooking']);
		await store.search('trav');
		expect(store.visible.map((c) => c.name)).toEqual(['Travel']);
		await store.search('');
		expect(store.visible).toHaveLength(2);
	});

	it('exports and imports, merging without overwriting', async () => {
		const c = await store.create();
		const u = await store.add('user', 'Hi', null);
		await store.add('assistant', 'Hello', u.id);
		const data = parseExport(JSON.stringify(await store.exportData()));

		// into an empty database: added as is
		const other = new ConversationStore(new ChatDatabase(`test-${n++}`));
		let plan = await other.importData(data);
		expect(plan.add).toHaveLength(1);
		await other.open(c.id);
		expect(other.thread.map((m) => m.content)).toEqual(['Hi', 'Hello']);

		// the same file again: nothing changes
		plan = await other.importData(data);
		expect(plan.skipped).toBe(1);
		expect(other.list).toHaveLength(1);

		// a changed conversation with the same id: added as a copy, the stored one is kept
		const changed = structuredClone(data);
		changed.conversations[0].messages.find((m) => m.content === 'Hi')!.content = 'Changed';
		plan = await other.importData(changed);
		expect(plan.copied).toBe(1);
		expect(other.list).toHaveLength(2);
		await other.open(c.id);
		expect(other.thread[0].content).toBe('Hi');
		const copy = other.list.find((x) => x.id !== c.id)!;
		expect(copy.name).toContain('(imported)');
		await other.open(copy.id);
		expect(other.thread.map((m) => m.content)).toEqual(['Changed', 'Hello']);
	});

	it('rejects files that are not exports', () => {
		expect(() => parseExport('nope')).toThrow('not JSON');
		expect(() => parseExport('{"format":"x"}')).toThrow('not a conversation export');
		expect(
			planImport({ format: 'llama-webui/conversations', version: 1, conversations: [] }, () => undefined).add
		).toEqual([]);
	});
});
