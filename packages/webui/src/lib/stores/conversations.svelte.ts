/**
 * The conversations and the open conversation's message tree, kept in IndexedDB, or on the server when it
 * has a store (`useStorage`, see services/storage.ts).
 */
import type { Attachment, Conversation, Message, Role } from '$lib/types';
import { ChatDatabase, newId } from '$lib/services/db';
import { BrowserStorage, type ChatStorage } from '$lib/services/storage';
import { latestLeaf, pathTo, siblings } from '$lib/services/tree';
import { makeExport, planImport, type ImportPlan } from '$lib/services/transfer';
import type { ConversationExport } from '$lib/types';

export class ConversationStore {
	/** every conversation, most recently updated first */
	list = $state<Conversation[]>([]);
	activeId = $state<string | null>(null);
	/** all messages (every branch) of the active conversation */
	messages = $state<Message[]>([]);
	/** ids of conversations matching the search (null: no search) */
	matches = $state<Set<string> | null>(null);

	active = $derived(this.list.find((c) => c.id === this.activeId) ?? null);
	/** the branch on screen, root first */
	thread = $derived(pathTo(this.messages, this.active?.currentLeaf ?? null));
	visible = $derived(this.matches ? this.list.filter((c) => this.matches!.has(c.id)) : this.list);

	/** where conversations are kept: this browser's IndexedDB unless `useStorage` says otherwise */
	storage: ChatStorage;
	/** the conversations live on the server (every browser sees them) */
	onServer = $state(false);

	constructor(readonly db = new ChatDatabase()) {
		this.storage = new BrowserStorage(db);
	}

	/** Keep conversations in `storage` from now on (the server's store); the list is read again. */
	async useStorage(storage: ChatStorage, onServer = true): Promise<void> {
		this.storage = storage;
		this.onServer = onServer;
		await this.load();
		if (this.activeId && !this.list.some((c) => c.id === this.activeId)) await this.open(null);
		else await this.open(this.activeId);
	}

	async load(): Promise<void> {
		this.list = await this.storage.conversations();
	}

	async open(id: string | null): Promise<void> {
		this.activeId = id;
		this.messages = id ? await this.storage.messages(id) : [];
	}

	async create(name = 'New conversation'): Promise<Conversation> {
		const now = Date.now();
		const conv: Conversation = { id: newId(), name, currentLeaf: null, createdAt: now, updatedAt: now };
		await this.storage.addConversation(conv);
		this.list = [conv, ...this.list];
		await this.open(conv.id);
		return conv;
	}

	async rename(id: string, name: string): Promise<void> {
		name = name.trim();
		if (!name) return;
		await this.storage.updateConversation(id, { name });
		this.list = this.list.map((c) => (c.id === id ? { ...c, name } : c));
	}

	async remove(id: string): Promise<void> {
		await this.storage.removeConversation(id);
		this.list = this.list.filter((c) => c.id !== id);
		if (this.activeId === id) await this.open(null);
	}

	/** Filter the list by name or message text (case-insensitive); an empty query clears the filter. */
	async search(query: string): Promise<void> {
		const q = query.trim().toLowerCase();
		if (!q) {
			this.matches = null;
			return;
		}
		const ids = new Set(this.list.filter((c) => c.name.toLowerCase().includes(q)).map((c) => c.id));
		for (const id of await this.storage.search(q)) ids.add(id);
		this.matches = ids;
	}

	/**
	 * Append a message under `parent` in a conversation (the active one unless `convId` names another:
	 * a reply may finish after the user moved on) and show its branch.
	 */
	async add(
		role: Role,
		content: string,
		parent: string | null,
		extra: Partial<Omit<Message, 'id' | 'convId' | 'parent' | 'role' | 'content' | 'createdAt'>> = {},
		convId: string | null = this.activeId
	): Promise<Message> {
		const conv = this.list.find((c) => c.id === convId);
		if (!conv) throw new Error('no open conversation');
		const siblings = conv.id === this.activeId ? this.messages : await this.messagesOf(conv.id);
		const msg: Message = {
			id: newId(),
			convId: conv.id,
			parent,
			role,
			content,
			createdAt: Math.max(Date.now(), ...siblings.map((m) => m.createdAt + 1)),
			// plain objects: IndexedDB cannot store the proxies of reactive state
			...($state.snapshot(extra) as typeof extra)
		};
		await this.storage.putMessage(msg);
		if (conv.id === this.activeId) this.messages = [...this.messages, msg];
		// the first user message names a new conversation
		const named = conv.name === 'New conversation' && role === 'user' && !parent;
		await this.setLeaf(msg.id, named ? content.slice(0, 60).split('\n')[0] : undefined, conv.id);
		return msg;
	}

	/** The messages of any conversation (the loaded ones for the active conversation). */
	async messagesOf(convId: string): Promise<Message[]> {
		if (convId === this.activeId) return this.messages;
		return this.storage.messages(convId);
	}

	/** Change a message in memory (cheap: called for every streamed token); `save` stores it. */
	patch(id: string, change: Partial<Message>): void {
		const i = this.messages.findIndex((m) => m.id === id);
		if (i >= 0) this.messages[i] = { ...this.messages[i], ...change };
	}

	async save(id: string): Promise<void> {
		const m = this.messages.find((x) => x.id === id);
		if (m) await this.storage.putMessage($state.snapshot(m) as Message);
	}

	/** Store a whole message (in any conversation) and show it if its conversation is open. */
	async put(msg: Message): Promise<void> {
		const plain = $state.snapshot(msg) as Message;
		const i = this.messages.findIndex((m) => m.id === msg.id);
		if (i >= 0) this.messages[i] = plain;
		await this.storage.putMessage(plain);
	}

	/** The replies that were still streaming when the page went away (every conversation). */
	async unfinished(): Promise<Message[]> {
		return this.storage.unfinished();
	}

	/** Show the branch that goes through message `id` (its newest continuation). */
	async switchTo(id: string): Promise<void> {
		await this.setLeaf(latestLeaf(this.messages, id));
	}

	/** The versions of a message: its siblings' ids and its index among them. */
	versions(id: string) {
		return siblings(this.messages, id);
	}

	private async setLeaf(leaf: string, name?: string, id = this.activeId!): Promise<void> {
		const change: Partial<Conversation> = { currentLeaf: leaf, updatedAt: Date.now() };
		if (name) change.name = name;
		await this.storage.updateConversation(id, change);
		const conv = { ...this.list.find((c) => c.id === id)!, ...change };
		this.list = [conv, ...this.list.filter((c) => c.id !== id)];
	}

	/** One conversation (or all of them) with every message, ready to be saved as JSON. */
	async exportData(id?: string): Promise<ConversationExport> {
		const convs = id ? this.list.filter((c) => c.id === id) : this.list;
		const items = [];
		for (const c of convs) {
			const messages = await this.storage.messages(c.id);
			items.push({ conversation: $state.snapshot(c) as Conversation, messages });
		}
		return makeExport(items);
	}

	/** Merge an export into the stored conversations (see `planImport`: nothing is overwritten). */
	async importData(data: ConversationExport): Promise<ImportPlan> {
		const stored = new Map<string, Message[]>();
		for (const item of data.conversations) {
			const id = item.conversation.id;
			if (await this.storage.hasConversation(id)) stored.set(id, await this.storage.messages(id));
		}
		const plan = planImport(data, (id) => stored.get(id));
		await this.storage.addAll(plan.add);
		await this.load();
		return plan;
	}
}
