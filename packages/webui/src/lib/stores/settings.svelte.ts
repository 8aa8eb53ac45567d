/** The user's settings in localStorage; sampling values default to the server's (`/props`). */
import type { SamplingParams, Settings, Theme } from '$lib/types';

export const STORAGE_KEY = 'llama-webui.settings';

const INITIAL: Settings = {
	theme: 'system',
	apiKey: '',
	systemPrompt: '',
	showReasoning: true,
	useTools: true,
	model: '',
	sampling: {}
};

/** Used until `/props` answers (llama.cpp's own defaults). */
export const FALLBACK_SAMPLING: SamplingParams = {
	temperature: 0.8,
	top_k: 40,
	top_p: 0.95,
	min_p: 0.05,
	max_tokens: -1,
	repeat_penalty: 1,
	presence_penalty: 0,
	frequency_penalty: 0,
	seed: -1
};

export const SAMPLING_KEYS = Object.keys(FALLBACK_SAMPLING) as (keyof SamplingParams)[];

/** Keep only known keys with values of the right type (settings files and old versions may differ). */
export function sanitize(raw: unknown): Settings {
	const r = (raw && typeof raw === 'object' ? raw : {}) as Record<string, unknown>;
	const sampling: Partial<SamplingParams> = {};
	const s = (r.sampling && typeof r.sampling === 'object' ? r.sampling : {}) as Record<string, unknown>;
	for (const key of SAMPLING_KEYS) {
		if (typeof s[key] === 'number' && Number.isFinite(s[key])) sampling[key] = s[key] as number;
	}
	return {
		theme: r.theme === 'light' || r.theme === 'dark' ? r.theme : 'system',
		apiKey: typeof r.apiKey === 'string' ? r.apiKey : '',
		systemPrompt: typeof r.systemPrompt === 'string' ? r.systemPrompt : '',
		showReasoning: typeof r.showReasoning === 'boolean' ? r.showReasoning : true,
		useTools: typeof r.useTools === 'boolean' ? r.useTools : true,
		model: typeof r.model === 'string' ? r.model : '',
		sampling
	};
}

export class SettingsStore {
	value = $state<Settings>(structuredClone(INITIAL));
	/** the server's defaults, from `/props` */
	defaults = $state<SamplingParams>({ ...FALLBACK_SAMPLING });
	/** what is sent: the server's defaults overridden by the user's values */
	sampling = $derived<SamplingParams>({ ...this.defaults, ...this.value.sampling });

	constructor(private storage: Pick<Storage, 'getItem' | 'setItem'> | undefined = globalThis.localStorage) {
		try {
			const saved = storage?.getItem(STORAGE_KEY);
			if (saved) this.value = sanitize(JSON.parse(saved));
		} catch {
			// unreadable settings: start from the initial ones
		}
	}

	private save(): void {
		this.storage?.setItem(STORAGE_KEY, JSON.stringify(this.value));
	}

	update(change: Partial<Omit<Settings, 'sampling'>>): void {
		this.value = { ...this.value, ...change };
		this.save();
	}

	/** Set one sampling value; the server's default value removes the override. */
	setSampling<K extends keyof SamplingParams>(key: K, v: SamplingParams[K]): void {
		const sampling = { ...this.value.sampling };
		if (v === this.defaults[key] || !Number.isFinite(v)) delete sampling[key];
		else sampling[key] = v;
		this.value = { ...this.value, sampling };
		this.save();
	}

	/** Back to the server's sampling defaults. */
	resetSampling(): void {
		this.value = { ...this.value, sampling: {} };
		this.save();
	}

	setTheme(theme: Theme): void {
		this.update({ theme });
	}

	/** The settings as a JSON file's text (the API key is left out). */
	exportText(): string {
		const { apiKey: _, ...rest } = $state.snapshot(this.value);
		return JSON.stringify({ format: 'llama-webui/settings', version: 1, settings: rest }, null, 2);
	}

	/** Replace the settings with a file's (keeps the API key); throws when the file is not a settings file. */
	importText(text: string): void {
		const data = JSON.parse(text) as { format?: string; settings?: unknown };
		if (data?.format !== 'llama-webui/settings') throw new Error('The file is not a settings export.');
		this.value = { ...sanitize(data.settings), apiKey: this.value.apiKey };
		this.save();
	}
}
