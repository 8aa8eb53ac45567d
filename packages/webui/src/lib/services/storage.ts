/**
 * Where conversations are kept: this browser's IndexedDB (`BrowserStorage`, the default), or the server
 * (`ServerStorage`) when llama-server was started with `--store` (its `/props` says
 * `endpoint_conversations`), so the same chats appear in every browser.
 *
 * On the server, a conversation is one of OpenAI's Conversations (`/v1/conversations`): its name, branch
 * and times in the conversation's metadata, each message (every branch, attachments included) one item
 * whose `metadata.message` is the message as the app keeps it. The server's copy is read once when the app
 * starts; changes are written through.
 */
import type { Conversation, Message } from '$lib/types';
import type { ApiClient } from './api';
import { ChatDatabase } from './db';

export interface ChatStorage {
	/** every conversation, most recently updated first */
	conversations(): Promise<Conversation[]>;
	hasConversation(id: string): Promise<boolean>;
	addConversation(conv: Conversation): Promise<void>;
	updateConversation(id: string, change: Partial<Conversation>): Promise<void>;
	/** a conversation and all its messages */
	removeConversation(id: string): Promise<void>;
	messages(convId: string): Promise<Message[]>;
	/** store a message, new or changed */
	putMessage(msg: Message): Promise<void>;
	/** replies still streaming when the page went away */
	unfinished(): Promise<Message[]>;
	/** ids of the conversations with a message whose text contains `query` (lower case) */
	search(query: string): Promise<Set<string>>;
	/** add whole conversations (an import) */
	addAll(items: { conversation: Conversation; messages: Message[] }[]): Promise<void>;
}

export class BrowserStorage implements ChatStorage {
	constructor(readonly db: ChatDatabase) {}

	conversations() {
		return this.db.conversations.orderBy('updatedAt').reverse().toArray();
	}
	async hasConversation(id: string) {
		return Boolean(await this.db.conversations.get(id));
	}
	async addConversation(conv: Conversation) {
		await this.db.conversations.add(conv);
	}
	async updateConversation(id: string, change: Partial<Conversation>) {
		await this.db.conversations.update(id, change);
	}
	async removeConversation(id: string) {
		await this.db.transaction('rw', this.db.conversations, this.db.messages, async () => {
			await this.db.messages.where('convId').equals(id).delete();
			await this.db.conversations.delete(id);
		});
	}
	messages(convId: string) {
		return this.db.messages.where('convId').equals(convId).toArray();
	}
	async putMessage(msg: Message) {
		await this.db.messages.put(msg);
	}
	unfinished() {
		return this.db.messages.where('status').equals('streaming').toArray();
	}
	async search(query: string) {
		const ids = new Set<string>();
		await this.db.messages
			.filter((m) => m.content.toLowerCase().includes(query))
			.each((m) => ids.add(m.convId));
		return ids;
	}
	async addAll(items: { conversation: Conversation; messages: Message[] }[]) {
		await this.db.transaction('rw', this.db.conversations, this.db.messages, async () => {
			for (const item of items) {
				await this.db.conversations.add(item.conversation);
				await this.db.messages.bulkAdd(item.messages);
			}
		});
	}
}

/** An item of a stored conversation, as the server lists it (only what the app reads). */
interface StoredItem {
	id: string;
	metadata?: { message?: Message };
}

interface StoredConversation {
	id: string;
	metadata: Record<string, string>;
}

interface Page<T> {
	data: T[];
	last_id: string | null;
	has_more: boolean;
}

const BATCH = 20; // the most items the server takes in one request

export class ServerStorage implements ChatStorage {
	/** the app's conversation id -> the server's; and everything read, kept up to date */
	private ids = new Map<string, string>();
	private convs = new Map<string, Conversation>();
	private msgs = new Map<string, Map<string, Message>>();
	/** writes go one after another, so a message saved twice in a row is stored in that order */
	private writes: Promise<unknown> = Promise.resolve();

	constructor(private api: ApiClient) {}

	private write<T>(fn: () => Promise<T>): Promise<T> {
		const next = this.writes.then(fn, fn);
		this.writes = next.catch(() => {});
		return next;
	}

	private async json<T>(path: string, method = 'GET', body?: unknown): Promise<T> {
		const init: RequestInit = { method };
		if (body !== undefined) init.body = JSON.stringify(body);
		return (await this.api.send(path, init)).json() as Promise<T>;
	}

	private async all<T extends { id: string }>(path: string, order: string): Promise<T[]> {
		const out: T[] = [];
		let after = '';
		for (;;) {
			const q = `limit=100&order=${order}${after ? `&after=${encodeURIComponent(after)}` : ''}`;
			const page = await this.json<Page<T>>(`${path}?${q}`);
			out.push(...page.data);
			if (!page.has_more || !page.last_id) return out;
			after = page.last_id;
		}
	}

	/** Read every conversation of this API key and its messages. */
	async load(): Promise<void> {
		this.ids.clear();
		this.convs.clear();
		this.msgs.clear();
		for (const c of await this.all<StoredConversation>('v1/conversations', 'desc')) {
			const conv = fromMetadata(c.metadata);
			if (!conv) continue; // made by another client, not the app
			this.ids.set(conv.id, c.id);
			this.convs.set(conv.id, conv);
			const items = await this.all<StoredItem>(`v1/conversations/${c.id}/items`, 'asc');
			const messages = new Map<string, Message>();
			for (const it of items) if (it.metadata?.message) messages.set(it.id, it.metadata.message);
			this.msgs.set(conv.id, messages);
		}
	}

	private server(id: string): string {
		const sid = this.ids.get(id);
		if (!sid) throw new Error(`conversation ${id} is not stored on the server`);
		return sid;
	}

	async conversations() {
		return [...this.convs.values()].sort((a, b) => b.updatedAt - a.updatedAt);
	}
	async hasConversation(id: string) {
		return this.convs.has(id);
	}
	addConversation(conv: Conversation) {
		return this.write(async () => {
			const made = await this.json<{ id: string }>('v1/conversations', 'POST', {
				metadata: toMetadata(conv)
			});
			this.ids.set(conv.id, made.id);
			this.convs.set(conv.id, { ...conv });
			this.msgs.set(conv.id, new Map());
		});
	}
	updateConversation(id: string, change: Partial<Conversation>) {
		return this.write(async () => {
			const conv = { ...this.convs.get(id)!, ...change };
			await this.json(`v1/conversations/${this.server(id)}`, 'POST', { metadata: toMetadata(conv) });
			this.convs.set(id, conv);
		});
	}
	removeConversation(id: string) {
		return this.write(async () => {
			await this.json(`v1/conversations/${this.server(id)}`, 'DELETE');
			this.ids.delete(id);
			this.convs.delete(id);
			this.msgs.delete(id);
		});
	}
	async messages(convId: string) {
		return [...(this.msgs.get(convId)?.values() ?? [])];
	}
	putMessage(msg: Message) {
		return this.write(async () => {
			const sid = this.server(msg.convId);
			const known = this.msgs.get(msg.convId)!;
			const item = toItem(msg);
			if (known.has(msg.id)) await this.json(`v1/conversations/${sid}/items/${msg.id}`, 'POST', item);
			else await this.json(`v1/conversations/${sid}/items`, 'POST', { items: [item] });
			known.set(msg.id, msg);
		});
	}
	async unfinished() {
		return [...this.msgs.values()].flatMap((m) => [...m.values()]).filter((m) => m.status === 'streaming');
	}
	async search(query: string) {
		const ids = new Set<string>();
		for (const [convId, messages] of this.msgs)
			for (const m of messages.values()) if (m.content.toLowerCase().includes(query)) ids.add(convId);
		return ids;
	}
	async addAll(items: { conversation: Conversation; messages: Message[] }[]) {
		for (const { conversation, messages } of items) {
			await this.addConversation(conversation);
			const sid = this.server(conversation.id);
			for (let i = 0; i < messages.length; i += BATCH) {
				const batch = messages.slice(i, i + BATCH);
				await this.write(() =>
					this.json(`v1/conversations/${sid}/items`, 'POST', { items: batch.map(toItem) })
				);
				for (const m of batch) this.msgs.get(conversation.id)!.set(m.id, m);
			}
		}
	}
}

/** The conversation's fields as the server's metadata (strings of at most 512 characters). */
function toMetadata(c: Conversation): Record<string, string> {
	return {
		app: 'llama-webui',
		ui_id: c.id,
		name: c.name.slice(0, 512),
		leaf: c.currentLeaf ?? '',
		created: String(c.createdAt),
		updated: String(c.updatedAt)
	};
}

function fromMetadata(m: Record<string, string> | undefined): Conversation | null {
	if (!m || m.app !== 'llama-webui' || !m.ui_id) return null;
	return {
		id: m.ui_id,
		name: m.name ?? '',
		currentLeaf: m.leaf || null,
		createdAt: Number(m.created) || 0,
		updatedAt: Number(m.updated) || 0
	};
}

/** A message as a conversation item: OpenAI's shape for its text, the whole message in `metadata`. */
function toItem(m: Message): Record<string, unknown> {
	const message = { ...m };
	if (m.role === 'tool')
		return {
			type: 'function_call_output',
			id: m.id,
			call_id: m.toolCallId ?? '',
			output: m.content,
			metadata: { message }
		};
	return { type: 'message', id: m.id, role: m.role, content: m.content, metadata: { message } };
}
