/**
 * The server's tools (`GET /tools`, `POST /tools`) and the pieces of the agentic loop that need no UI:
 * joining streamed tool-call parts, and a tool's result as the text of a `tool` message.
 */
import type { ToolCall } from '$lib/types';
import { ApiError, type ApiClient, type ToolCallDelta } from './api';

/** One entry of `GET /tools`. */
export interface ServerTool {
	tool: string;
	display_name: string;
	type: 'server' | 'mcp' | string;
	permissions: { write: boolean };
	definition: { type: 'function'; function: { name: string; description?: string; parameters?: unknown } };
}

/** The server's tools; none when the feature is off (403) or the server has no such route (404). */
export async function listTools(api: ApiClient): Promise<ServerTool[]> {
	try {
		const list = await (await api.send('tools')).json();
		return Array.isArray(list) ? (list as ServerTool[]) : [];
	} catch (e) {
		if (e instanceof ApiError && (e.status === 403 || e.status === 404)) return [];
		throw e;
	}
}

/**
 * Run one tool on the server. Resolves to the text for the `tool` message: `plain_text_response`
 * verbatim, any other result as JSON. A tool-level failure (`{"error": ...}`, HTTP 200) is `ok: false`.
 */
export async function callTool(
	api: ApiClient,
	tool: string,
	params: Record<string, unknown>,
	signal?: AbortSignal
): Promise<{ ok: boolean; text: string }> {
	const body = JSON.stringify({ tool, params });
	let res: Response;
	try {
		res = await api.send('tools', { method: 'POST', body, signal });
	} catch (e) {
		if (!(e instanceof ApiError) || e.kind === 'network' || e.kind === 'auth') throw e;
		return { ok: false, text: `Error: ${e.message}` }; // a request-shape error: the model may fix it
	}
	return toolResultText(await res.json());
}

/** A `POST /tools` answer as the `tool` message text (the contract of the tools API). */
export function toolResultText(result: unknown): { ok: boolean; text: string } {
	const r = (result ?? {}) as Record<string, unknown>;
	if (typeof r.plain_text_response === 'string') return { ok: true, text: r.plain_text_response };
	if (typeof r.error === 'string' && Object.keys(r).length === 1)
		return { ok: false, text: `Error: ${r.error}` };
	return { ok: true, text: JSON.stringify(result) };
}

/** The tool calls so far with the parts of one chunk merged in (a new list; the input is not changed). */
export function mergeToolCalls(calls: ToolCall[], deltas: ToolCallDelta[]): ToolCall[] {
	const out = calls.map((c) => ({ ...c }));
	for (const d of deltas) {
		const i = typeof d.index === 'number' ? d.index : out.length;
		out[i] ??= { id: '', name: '', arguments: '' };
		if (d.id) out[i].id = d.id;
		if (d.function?.name) out[i].name += d.function.name;
		if (d.function?.arguments) out[i].arguments += d.function.arguments;
	}
	return out.filter(Boolean);
}

/** A call's arguments as an object (the model may write invalid JSON: then an error to send back). */
export function parseArguments(call: ToolCall): Record<string, unknown> | string {
	if (!call.arguments.trim()) return {};
	try {
		const v = JSON.parse(call.arguments);
		return v && typeof v === 'object' && !Array.isArray(v)
			? (v as Record<string, unknown>)
			: 'the arguments must be a JSON object';
	} catch (e) {
		return `the arguments are not valid JSON (${e instanceof Error ? e.message : e})`;
	}
}
