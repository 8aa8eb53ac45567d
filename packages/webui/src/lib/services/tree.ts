/** The message tree of one conversation: branches, the path on screen, siblings to switch between. */
import type { Message } from '$lib/types';

/** Messages by id. */
export function byId(messages: Message[]): Map<string, Message> {
	return new Map(messages.map((m) => [m.id, m]));
}

/** The children of `parent`, oldest first. */
export function childrenOf(messages: Message[], parent: string | null): Message[] {
	return messages.filter((m) => m.parent === parent).sort((a, b) => a.createdAt - b.createdAt);
}

/** The messages from the root down to `leaf` (empty when `leaf` is null or unknown). */
export function pathTo(messages: Message[], leaf: string | null): Message[] {
	const index = byId(messages);
	const path: Message[] = [];
	for (let m = leaf ? index.get(leaf) : undefined; m; m = m.parent ? index.get(m.parent) : undefined) {
		path.push(m);
	}
	return path.reverse();
}

/** The newest leaf under `id`, following the newest child at each step: where a switched-to branch ends. */
export function latestLeaf(messages: Message[], id: string): string {
	let current = id;
	for (;;) {
		const kids = childrenOf(messages, current);
		if (!kids.length) return current;
		current = kids[kids.length - 1].id;
	}
}

/** The versions of a message (itself and its siblings, oldest first) and its position among them. */
export function siblings(messages: Message[], id: string): { ids: string[]; index: number } {
	const m = messages.find((x) => x.id === id);
	if (!m) return { ids: [], index: -1 };
	const ids = childrenOf(messages, m.parent).map((x) => x.id);
	return { ids, index: ids.indexOf(id) };
}
