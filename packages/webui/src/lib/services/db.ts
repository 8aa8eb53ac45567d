/** IndexedDB through Dexie: one table of conversations, one of messages (every branch of every tree). */
import Dexie, { type EntityTable } from 'dexie';
import type { Conversation, Message } from '$lib/types';

export class ChatDatabase extends Dexie {
	conversations!: EntityTable<Conversation, 'id'>;
	messages!: EntityTable<Message, 'id'>;

	constructor(name = 'llama-webui') {
		super(name);
		this.version(1).stores({
			conversations: 'id, updatedAt',
			messages: 'id, convId, parent'
		});
		// the status index finds the replies that were still streaming when the page went away
		this.version(2).stores({ messages: 'id, convId, parent, status' });
	}
}

/** A new random id (UUID v4 where the browser offers it). */
export function newId(): string {
	return globalThis.crypto?.randomUUID?.() ?? Math.random().toString(36).slice(2) + Date.now().toString(36);
}
