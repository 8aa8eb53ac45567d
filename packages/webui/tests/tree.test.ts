import { describe, expect, it } from 'vitest';
import { latestLeaf, pathTo, siblings } from '../src/lib/services/tree';
import type { Message } from '../src/lib/types';

const msg = (id: string, parent: string | null, createdAt: number): Message => ({
	id,
	convId: 'c',
	parent,
	role: parent === null || id.startsWith('u') ? 'user' : 'assistant',
	content: id,
	createdAt
});

// u1 -> a1, a2 (regenerated) ; a2 -> u2
const tree = [msg('u1', null, 1), msg('a1', 'u1', 2), msg('a2', 'u1', 3), msg('u2', 'a2', 4)];

describe('message tree', () => {
	it('walks from the root to a leaf', () => {
		expect(pathTo(tree, 'u2').map((m) => m.id)).toEqual(['u1', 'a2', 'u2']);
		expect(pathTo(tree, null)).toEqual([]);
	});

	it('lists the versions of a message', () => {
		expect(siblings(tree, 'a1')).toEqual({ ids: ['a1', 'a2'], index: 0 });
		expect(siblings(tree, 'a2')).toEqual({ ids: ['a1', 'a2'], index: 1 });
		expect(siblings(tree, 'nope').index).toBe(-1);
	});

	it('follows the newest continuation of a branch', () => {
		expect(latestLeaf(tree, 'a2')).toBe('u2');
		expect(latestLeaf(tree, 'a1')).toBe('a1');
		expect(latestLeaf(tree, 'u1')).toBe('u2');
	});
});
