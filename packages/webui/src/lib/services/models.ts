/**
 * Router mode (llama-router, or llama-server started with a models directory): the model catalogue
 * (`GET /models`), its live status events (`GET /models/sse`), loading, unloading, downloading into the
 * cache (`POST /models`) and deleting from it (`DELETE /models`).
 */
import type { Message } from '$lib/types';
import { ApiError, type ApiClient } from './api';
import { sseData } from './sse';

export type ModelState =
	'unloaded' | 'loading' | 'loaded' | 'sleeping' | 'downloading' | 'downloaded' | 'failed';

/** One entry of the router's `GET /models`. */
export interface RouterModel {
	id: string;
	aliases?: string[];
	tags?: string[];
	status: {
		value: string;
		failed?: boolean;
		exit_code?: number;
		args?: string[];
		cluster?: ClusterStatus;
	};
	architecture?: { input_modalities?: string[]; output_modalities?: string[] };
	source?: string;
	can_remove?: boolean;
}

/** `status.cluster` of a model whose replicas run on a Ray cluster (`llama-router --ray`). */
export interface ClusterStatus {
	replicas: {
		name: string;
		state: string;
		node_id?: string;
		node_ip?: string;
		in_flight?: number;
		served?: number;
		restarts?: number;
	}[];
	desired: number;
	min_replicas: number;
	max_replicas: number;
	waiting?: number;
}

/** One line about a replicated model's replicas ("" for a model without): how many serve, on how many
 * nodes, the requests in flight and waiting, and the replicas being replaced or placed. */
export function replicaSummary(m: RouterModel): string {
	const c = m.status.cluster;
	if (!c) return '';
	const serving = c.replicas.filter((r) => r.state === 'loaded');
	const nodes = new Set(serving.map((r) => r.node_id ?? r.node_ip ?? r.name)).size;
	const range = `min ${c.min_replicas}, max ${c.max_replicas}`;
	const parts = [
		`${serving.length} of ${c.desired} replica${c.desired === 1 ? '' : 's'} serving` +
			(serving.length ? ` on ${nodes} node${nodes === 1 ? '' : 's'}` : '') +
			` (${range})`
	];
	const inFlight = c.replicas.reduce((n, r) => n + (r.in_flight ?? 0), 0);
	if (inFlight || c.waiting) parts.push(`${inFlight} in flight, ${c.waiting ?? 0} waiting`);
	const other = c.replicas.filter((r) => r.state !== 'loaded');
	if (other.length) parts.push(other.map((r) => `${r.name} ${r.state}`).join(', '));
	return parts.join(' · ');
}

/** One event of `GET /models/sse`. */
export interface ModelEvent {
	model: string;
	event: string;
	data?: {
		status?: string;
		exit_code?: number;
		progress?: Record<string, { done: number; total: number }> | { value?: number };
	};
}

/** The state to show: a model whose last child exited with an error is `failed` until it loads again. */
export function stateOf(m: RouterModel): ModelState {
	if (m.status.failed && m.status.value === 'unloaded') return 'failed';
	return (m.status.value || 'unloaded') as ModelState;
}

export async function listModels(api: ApiClient, reload = false): Promise<RouterModel[]> {
	const body = await (await api.send(reload ? 'models?reload=1' : 'models')).json();
	return Array.isArray(body?.data) ? (body.data as RouterModel[]) : [];
}

async function post(api: ApiClient, path: string, model: string): Promise<void> {
	await api.send(path, { method: 'POST', body: JSON.stringify({ model }) });
}

export const loadModel = (api: ApiClient, model: string) => post(api, 'models/load', model);
export const unloadModel = (api: ApiClient, model: string) => post(api, 'models/unload', model);
/** Download `user/repo[:quant]` or a URL into the router's cache (progress comes as events). */
export const downloadModel = (api: ApiClient, spec: string) => post(api, 'models', spec);

export async function deleteModel(api: ApiClient, model: string): Promise<void> {
	await api.send(`models?model=${encodeURIComponent(model)}`, { method: 'DELETE' });
}

/** The router's model events until `signal` aborts or the stream ends. */
export async function* modelEvents(api: ApiClient, signal: AbortSignal): AsyncGenerator<ModelEvent> {
	const res = await api.send('models/sse', { signal });
	if (!res.body) throw new ApiError('server', 'The server sent no events.');
	for await (const data of sseData(res.body)) {
		try {
			yield JSON.parse(data) as ModelEvent;
		} catch {
			// not an event of ours: skip it
		}
	}
}

/** Bytes done and in total over the files of one download (`download_progress` may list several). */
export function downloadTotals(progress: Record<string, { done: number; total: number }>): {
	done: number;
	total: number;
} {
	let done = 0;
	let total = 0;
	for (const p of Object.values(progress)) {
		done += p.done ?? 0;
		total += p.total ?? 0;
	}
	return { done, total };
}

/** The input modalities a branch's attachments need besides text (`image`, `audio`). */
export function neededModalities(thread: Message[]): string[] {
	const need = new Set<string>();
	for (const m of thread) for (const a of m.attachments ?? []) if (a.kind === 'image') need.add('image');
	return [...need];
}

/** What a model lacks of `needed` (unknown architecture: text only, as the router reports). */
export function missingModalities(model: RouterModel | undefined, needed: string[]): string[] {
	const has = new Set(model?.architecture?.input_modalities ?? ['text']);
	return needed.filter((n) => !has.has(n));
}
