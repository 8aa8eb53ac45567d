import { describe, expect, it } from 'vitest';
import { ApiClient, ApiError, type ServerProps } from '../src/lib/services/api';
import { ServerStore } from '../src/lib/stores/server.svelte';
import { SettingsStore } from '../src/lib/stores/settings.svelte';

class FakeClient extends ApiClient {
	answer: ServerProps | ApiError = new ApiError('network', 'down');
	async props(): Promise<ServerProps> {
		if (this.answer instanceof ApiError) throw this.answer;
		return this.answer;
	}
}

const PROPS: ServerProps = {
	default_generation_settings: { params: { temperature: 0.2, top_k: 7 }, n_ctx: 2048 },
	modalities: { vision: true },
	model_path: '/models/SmolLM2.gguf'
};

describe('ServerStore', () => {
	it('takes sampling defaults and modalities from /props', async () => {
		const api = new FakeClient();
		api.answer = PROPS;
		const settings = new SettingsStore(undefined);
		const server = new ServerStore(api, settings);
		await server.connect();
		expect(server.status).toBe('ready');
		expect(settings.sampling.temperature).toBe(0.2);
		expect(settings.sampling.top_k).toBe(7);
		expect(server.vision).toBe(true);
		expect(server.modelName).toBe('SmolLM2.gguf');
	});

	it('tells a server that is down from one that wants a key, and retries with a new key', async () => {
		const api = new FakeClient();
		const settings = new SettingsStore(undefined);
		const server = new ServerStore(api, settings);
		await server.connect();
		expect(server.status).toBe('down');
		api.answer = new ApiError('auth', 'bad key', 401);
		await server.connect();
		expect(server.status).toBe('auth');
		api.answer = PROPS;
		expect(await server.useKey(' k1 ')).toBe(true);
		expect(api.apiKey).toBe('k1');
		expect(settings.value.apiKey).toBe('k1');
	});
});
