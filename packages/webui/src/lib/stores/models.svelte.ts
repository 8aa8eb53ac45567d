/**
 * Router mode: the model catalogue kept live from `/models/sse` (statuses, download progress, removals),
 * and the actions on it (load, unload, download, delete).
 */
import type { ApiClient } from '$lib/services/api';
import * as svc from '$lib/services/models';
import type { ModelEvent, ModelState, RouterModel } from '$lib/services/models';

/** Re-subscribing to the events after they stopped (ms). */
const RETRY_MS = 2000;

export class ModelsStore {
	list = $state<RouterModel[]>([]);
	/** downloads in progress: model name -> bytes done and total */
	downloads = $state<Record<string, { done: number; total: number }>>({});
	/** loading progress per model (0..1) while a child loads */
	loading = $state<Record<string, number>>({});
	error = $state('');
	private abort: AbortController | null = null;

	constructor(private api: ApiClient) {}

	find(name: string): RouterModel | undefined {
		return this.list.find((m) => m.id === name || m.aliases?.includes(name));
	}

	state(name: string): ModelState {
		const m = this.find(name);
		return m ? svc.stateOf(m) : 'unloaded';
	}

	/** Whether a model takes a modality (`image`, `audio`) as input. */
	accepts(name: string, modality: string): boolean {
		return svc.missingModalities(this.find(name), [modality]).length === 0;
	}

	async refresh(reload = false): Promise<void> {
		try {
			this.list = await svc.listModels(this.api, reload);
		} catch (e) {
			this.error = e instanceof Error ? e.message : String(e);
		}
	}

	/** Read the catalogue and follow its events (re-subscribing after a drop) until `stop`. */
	async start(): Promise<void> {
		this.stop();
		const abort = (this.abort = new AbortController());
		// subscribe first: the events carry no snapshot, so the list is read once the stream is open
		void this.follow(abort.signal);
		await this.refresh();
	}

	stop(): void {
		this.abort?.abort();
		this.abort = null;
	}

	private async follow(signal: AbortSignal): Promise<void> {
		while (!signal.aborted) {
			try {
				for await (const e of svc.modelEvents(this.api, signal)) this.apply(e);
			} catch {
				// dropped or refused: try again below
			}
			if (signal.aborted) return;
			await new Promise((r) => setTimeout(r, RETRY_MS));
			await this.refresh();
		}
	}

	/** One event folded into the list. */
	apply(e: ModelEvent): void {
		const name = e.model;
		switch (e.event) {
			case 'model_status':
			case 'status_change': {
				const value = e.data?.status;
				if (!value) return;
				this.setStatus(name, value, e.data?.exit_code);
				const p = e.data?.progress as { value?: number } | undefined;
				if (value === 'loading' && typeof p?.value === 'number') this.loading[name] = p.value;
				else if (value !== 'loading') delete this.loading[name];
				if (value === 'loaded' && !this.find(name)?.architecture) void this.refresh();
				return;
			}
			case 'download_progress': {
				const progress = e.data?.progress as Record<string, { done: number; total: number }> | undefined;
				if (progress) this.downloads[name] = svc.downloadTotals(progress);
				this.setStatus(name, 'downloading');
				return;
			}
			case 'download_finished':
			case 'download_failed':
				delete this.downloads[name];
				if (e.event === 'download_failed') this.error = `The download of ${name} failed.`;
				void this.refresh(); // the router reloads its catalogue after a download
				return;
			case 'model_remove':
				this.list = this.list.filter((m) => m.id !== name);
				return;
			case 'models_reload':
				void this.refresh();
		}
	}

	private setStatus(name: string, value: string, exitCode?: number): void {
		const failed = value === 'unloaded' && typeof exitCode === 'number' && exitCode !== 0;
		const i = this.list.findIndex((m) => m.id === name);
		const status = { value, ...(failed ? { failed: true, exit_code: exitCode } : {}) };
		if (i >= 0) this.list[i] = { ...this.list[i], status: { ...this.list[i].status, ...status, failed } };
		else this.list = [...this.list, { id: name, status }];
	}

	private async act(fn: () => Promise<void>): Promise<boolean> {
		this.error = '';
		try {
			await fn();
			return true;
		} catch (e) {
			this.error = e instanceof Error ? e.message : String(e);
			return false;
		}
	}

	load = (name: string) => this.act(() => svc.loadModel(this.api, name));
	unload = (name: string) => this.act(() => svc.unloadModel(this.api, name));

	/** Start a download; the entry shows `downloading` at once, progress follows from the events. */
	download = (spec: string) =>
		this.act(async () => {
			await svc.downloadModel(this.api, spec.trim());
			await this.refresh();
		});

	remove = (name: string) =>
		this.act(async () => {
			await svc.deleteModel(this.api, name);
			this.list = this.list.filter((m) => m.id !== name);
		});
}
