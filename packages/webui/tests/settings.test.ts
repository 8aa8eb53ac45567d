import { describe, expect, it } from 'vitest';
import { sanitize, SettingsStore, STORAGE_KEY } from '../src/lib/stores/settings.svelte';

function memoryStorage(init: Record<string, string> = {}) {
	const data = new Map(Object.entries(init));
	return {
		data,
		getItem: (k: string) => data.get(k) ?? null,
		setItem: (k: string, v: string) => void data.set(k, v)
	};
}

describe('SettingsStore', () => {
	it('overrides the server defaults only where the user changed a value', () => {
		const store = new SettingsStore(memoryStorage());
		store.defaults = { ...store.defaults, temperature: 0.7, top_k: 20 };
		store.setSampling('temperature', 0.2);
		expect(store.sampling.temperature).toBe(0.2);
		expect(store.sampling.top_k).toBe(20);
		store.setSampling('temperature', 0.7); // back to the default: no override
		expect(store.value.sampling).toEqual({});
	});

	it('persists to storage and reads it back', () => {
		const storage = memoryStorage();
		const a = new SettingsStore(storage);
		a.setTheme('dark');
		a.update({ systemPrompt: 'Be brief.' });
		a.setSampling('top_p', 0.5);
		const b = new SettingsStore(storage);
		expect(b.value.theme).toBe('dark');
		expect(b.value.systemPrompt).toBe('Be brief.');
		expect(b.sampling.top_p).toBe(0.5);
	});

	it('resets sampling to the server defaults', () => {
		const store = new SettingsStore(memoryStorage());
		store.setSampling('min_p', 0.2);
		store.resetSampling();
		expect(store.sampling.min_p).toBe(store.defaults.min_p);
	});

	it('exports without the API key and imports back', () => {
		const store = new SettingsStore(memoryStorage());
		store.update({ apiKey: 'secret', systemPrompt: 'Hi' });
		store.setSampling('top_k', 5);
		const text = store.exportText();
		expect(text).not.toContain('secret');
		const other = new SettingsStore(memoryStorage());
		other.update({ apiKey: 'mine' });
		other.importText(text);
		expect(other.value.systemPrompt).toBe('Hi');
		expect(other.value.sampling.top_k).toBe(5);
		expect(other.value.apiKey).toBe('mine');
		expect(() => other.importText('{"format":"other"}')).toThrow();
	});

	it('ignores broken or foreign stored values', () => {
		const store = new SettingsStore(memoryStorage({ [STORAGE_KEY]: '{not json' }));
		expect(store.value.theme).toBe('system');
		expect(sanitize({ theme: 'pink', sampling: { top_k: 'x', top_p: 0.5 } })).toMatchObject({
			theme: 'system',
			sampling: { top_p: 0.5 }
		});
	});
});
