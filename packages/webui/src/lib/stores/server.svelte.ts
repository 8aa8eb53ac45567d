/**
 * The connection to llama-server: its `/props` and `/tools`, whether it is up and accepts our API key,
 * and whether it is a router (many models, picked per request).
 */
import { ApiError, ApiClient, samplingDefaults, type ServerProps } from '$lib/services/api';
import { listTools, type ServerTool } from '$lib/services/tools';
import type { SettingsStore } from './settings.svelte';

export type ServerStatus = 'connecting' | 'ready' | 'loading' | 'auth' | 'down' | 'error';

export class ServerStore {
	props = $state<ServerProps | null>(null);
	status = $state<ServerStatus>('connecting');
	message = $state('');
	/** the server's tools (none unless it was started with tools or MCP servers) */
	tools = $state<ServerTool[]>([]);
	router = $derived(this.props?.role === 'router');
	/** the model requests name: the chosen one in router mode, none otherwise (the server has one) */
	model = $derived.by(() => (this.router ? this.settings.value.model : ''));
	vision = $derived(Boolean(this.props?.modalities?.vision));
	modelName = $derived((this.props?.model_alias || this.props?.model_path || '').split('/').pop() ?? '');

	constructor(
		readonly api: ApiClient,
		private settings: SettingsStore
	) {
		api.apiKey = settings.value.apiKey;
	}

	/** Read `/props`; its sampling defaults become the settings' defaults. */
	async connect(): Promise<void> {
		this.api.apiKey = this.settings.value.apiKey;
		this.status = 'connecting';
		try {
			this.props = await this.api.props();
			this.settings.defaults = samplingDefaults(this.props.default_generation_settings?.params ?? {});
			this.tools = await listTools(this.api).catch(() => []);
			this.status = 'ready';
			this.message = '';
		} catch (e) {
			const err = e instanceof ApiError ? e : new ApiError('server', String(e));
			this.status = { auth: 'auth', network: 'down', loading: 'loading', context: 'error', server: 'error' }[
				err.kind
			] as ServerStatus;
			this.message = err.message;
		}
	}

	/** Try a new API key: saved, then checked against the server. */
	async useKey(key: string): Promise<boolean> {
		this.settings.update({ apiKey: key.trim() });
		await this.connect();
		return this.status === 'ready';
	}
}
