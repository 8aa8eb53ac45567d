import { afterEach, describe, expect, it, vi } from 'vitest';
import { ApiClient } from '../src/lib/services/api';
import {
	downloadTotals,
	missingModalities,
	neededModalities,
	replicaSummary,
	stateOf,
	type RouterModel
} from '../src/lib/services/models';
import { ModelsStore } from '../src/lib/stores/models.svelte';
import type { Message } from '../src/lib/types';

afterEach(() => vi.unstubAllGlobals());

const model = (id: string, value: string, extra: Partial<RouterModel> = {}): RouterModel => ({
	id,
	status: { value },
	...extra
});

/** A router's `/models` answer and a recorder of the management calls. */
function router(list: RouterModel[]) {
	const calls: [string, string, unknown][] = [];
	vi.stubGlobal('fetch', async (url: string, init: RequestInit = {}) => {
		const u = new URL(url);
		calls.push([
			init.method ?? 'GET',
			u.pathname + u.search,
			init.body ? JSON.parse(String(init.body)) : null
		]);
		if (u.pathname === '/models' && (init.method ?? 'GET') === 'GET')
			return new Response(JSON.stringify({ data: list, object: 'list' }));
		if (u.pathname === '/models/sse') return new Response(new ReadableStream({ start() {} })); // no events
		return new Response('{"success":true}');
	});
	return calls;
}

describe('replicas on a Ray cluster', () => {
	it('says how many serve, where, what is in flight and what is being replaced', () => {
		expect(replicaSummary(model('plain', 'loaded'))).toBe('');
		const replicas = [
			{ name: 'm/0', state: 'loaded', node_id: 'a', in_flight: 2 },
			{ name: 'm/1', state: 'loaded', node_id: 'b', in_flight: 1 },
			{ name: 'm/2', state: 'lost', node_id: 'b' }
		];
		const cluster = { replicas, desired: 3, min_replicas: 1, max_replicas: 4, waiting: 1 };
		expect(replicaSummary(model('m', 'loaded', { status: { value: 'loaded', cluster } }))).toBe(
			'2 of 3 replicas serving on 2 nodes (min 1, max 4) · 3 in flight, 1 waiting · m/2 lost'
		);
		const none = { replicas: [], desired: 0, min_replicas: 0, max_replicas: 2 };
		expect(replicaSummary(model('z', 'unloaded', { status: { value: 'unloaded', cluster: none } }))).toBe(
			'0 of 0 replicas serving (min 0, max 2)'
		);
	});
});

describe('router models', () => {
	it('folds status, progress, download and removal events into the list', async () => {
		router([model('a', 'unloaded'), model('b', 'loaded')]);
		const store = new ModelsStore(new ApiClient('http://r/'));
		await store.refresh();
		store.apply({ model: 'a', event: 'model_status', data: { status: 'loading' } });
		store.apply({
			model: 'a',
			event: 'status_change',
			data: { status: 'loading', progress: { value: 0.5 } }
		});
		expect(store.state('a')).toBe('loading');
		expect(store.loading.a).toBe(0.5);
		store.apply({ model: 'a', event: 'status_change', data: { status: 'loaded' } });
		expect(store.state('a')).toBe('loaded');
		expect(store.loading.a).toBeUndefined();
		store.apply({ model: 'b', event: 'status_change', data: { status: 'unloaded', exit_code: 9 } });
		expect(store.state('b')).toBe('failed');
		const progress = {
			'http://h/x-1.gguf': { done: 10, total: 40 },
			'http://h/x-2.gguf': { done: 5, total: 60 }
		};
		store.apply({ model: 'x', event: 'download_progress', data: { progress } });
		expect(store.downloads.x).toEqual({ done: 15, total: 100 });
		expect(store.state('x')).toBe('downloading');
		store.apply({ model: 'x', event: 'download_finished' });
		expect(store.downloads.x).toBeUndefined();
		store.apply({ model: 'b', event: 'model_remove' });
		expect(store.find('b')).toBeUndefined();
	});

	it('sends load, unload, download and delete as the router expects', async () => {
		const calls = router([model('org/m:Q8_0', 'unloaded', { can_remove: true })]);
		const store = new ModelsStore(new ApiClient('http://r/'));
		await store.load('org/m:Q8_0');
		await store.unload('org/m:Q8_0');
		await store.download(' https://h/x.gguf ');
		await store.remove('org/m:Q8_0');
		expect(calls.filter((c) => !(c[0] === 'GET' && c[1] === '/models'))).toEqual([
			['POST', '/models/load', { model: 'org/m:Q8_0' }],
			['POST', '/models/unload', { model: 'org/m:Q8_0' }],
			['POST', '/models', { model: 'https://h/x.gguf' }],
			['DELETE', '/models?model=org%2Fm%3AQ8_0', null]
		]);
		expect(store.list).toEqual([]);
	});

	it('reports a refused action', async () => {
		vi.stubGlobal(
			'fetch',
			async () =>
				new Response(JSON.stringify({ error: { code: 400, message: 'model is already running' } }), {
					status: 400
				})
		);
		const store = new ModelsStore(new ApiClient('http://r/'));
		expect(await store.load('a')).toBe(false);
		expect(store.error).toMatch(/already running/);
	});

	it('knows which attachments a model cannot take', () => {
		const thread = [{ attachments: [{ name: 'c.png', kind: 'image', content: 'data:' }] }] as Message[];
		const need = neededModalities(thread);
		expect(need).toEqual(['image']);
		expect(missingModalities(model('t', 'loaded'), need)).toEqual(['image']); // unknown: text only
		const vision = model('v', 'loaded', { architecture: { input_modalities: ['text', 'image'] } });
		expect(missingModalities(vision, need)).toEqual([]);
		expect(stateOf(model('f', 'unloaded', { status: { value: 'unloaded', failed: true } }))).toBe('failed');
		expect(downloadTotals({})).toEqual({ done: 0, total: 0 });
	});
});
