/** Export and import of conversations (JSON files), merging into what is already stored. */
import type { Conversation, ConversationExport, Message } from '$lib/types';
import { newId } from './db';

export function makeExport(items: { conversation: Conversation; messages: Message[] }[]): ConversationExport {
	return { format: 'llama-webui/conversations', version: 1, conversations: items };
}

/** Check the shape of an export file; throws with a readable message when it is not one. */
export function parseExport(text: string): ConversationExport {
	let data: unknown;
	try {
		data = JSON.parse(text);
	} catch {
		throw new Error('The file is not JSON.');
	}
	const d = data as Partial<ConversationExport>;
	if (d?.format !== 'llama-webui/conversations' || !Array.isArray(d.conversations))
		throw new Error('The file is not a conversation export.');
	for (const item of d.conversations) {
		if (typeof item?.conversation?.id !== 'string' || !Array.isArray(item.messages))
			throw new Error('The file has a malformed conversation.');
	}
	return d as ConversationExport;
}

/** Same conversation, same messages: importing it again changes nothing. */
function sameContent(a: { conversation: Conversation; messages: Message[] }, b: Message[]): boolean {
	if (a.messages.length !== b.length) return false;
	const stored = new Map(b.map((m) => [m.id, m]));
	return a.messages.every((m) => stored.get(m.id)?.content === m.content);
}

/** A copy of a conversation under new ids (messages keep their tree). */
export function withNewIds(conversation: Conversation, messages: Message[], name: string) {
	const ids = new Map(messages.map((m) => [m.id, newId()]));
	const convId = newId();
	return {
		conversation: {
			...conversation,
			id: convId,
			name,
			currentLeaf: conversation.currentLeaf ? (ids.get(conversation.currentLeaf) ?? null) : null
		},
		messages: messages.map((m) => ({
			...m,
			id: ids.get(m.id)!,
			convId,
			parent: m.parent ? (ids.get(m.parent) ?? null) : null
		}))
	};
}

export interface ImportPlan {
	add: { conversation: Conversation; messages: Message[] }[];
	/** already stored with the same messages */
	skipped: number;
	/** ids already used by a different conversation: added as copies under new ids */
	copied: number;
}

/**
 * Decide what an import adds. New conversations are added as they are; one already stored unchanged is
 * skipped; one whose id is taken by different content is added as a copy — nothing is overwritten.
 */
export function planImport(
	data: ConversationExport,
	stored: (id: string) => Message[] | undefined
): ImportPlan {
	const plan: ImportPlan = { add: [], skipped: 0, copied: 0 };
	for (const item of data.conversations) {
		const messages = item.messages.map((m) => ({ ...m, convId: item.conversation.id }));
		const existing = stored(item.conversation.id);
		if (!existing) plan.add.push({ conversation: item.conversation, messages });
		else if (sameContent(item, existing)) plan.skipped++;
		else {
			plan.copied++;
			plan.add.push(withNewIds(item.conversation, messages, `${item.conversation.name} (imported)`));
		}
	}
	return plan;
}
