/** A reply being streamed: each step of the stream folded into the message, and its resumable id. */
import type { Message } from '$lib/types';
import type { StreamStep } from './api';
import { mergeToolCalls } from './tools';

/** The message with one stream step added: text, reasoning, tool calls, timings and the byte offset. */
export function applyStep(msg: Message, step: StreamStep): Message {
	const d = step.delta;
	const out: Message = { ...msg };
	if (out.stream) out.stream = { ...out.stream, offset: step.offset };
	if (!d) return out;
	if (d.content) out.content += d.content;
	if (d.reasoning) out.reasoning = (out.reasoning ?? '') + d.reasoning;
	if (d.toolCalls) out.toolCalls = mergeToolCalls(out.toolCalls ?? [], d.toolCalls);
	if (d.timings) out.timings = d.timings;
	return out;
}

/** The message once its stream ended: no longer `streaming`, no stream position; `status` if given. */
export function finished(msg: Message, status?: 'stopped' | 'error'): Message {
	const { stream: _s, status: _st, ...rest } = msg;
	return status ? { ...rest, status } : rest;
}

/**
 * The `X-Conversation-Id` of a conversation's replies: the conversation id, and in router mode
 * `<id>::<model>` (the router routes a replay to the model that generates it).
 */
export function streamIdFor(convId: string, model = ''): string {
	return model ? `${convId}::${model}` : convId;
}

/** Whether an error means the connection dropped (worth re-attaching to the stream) rather than a refusal. */
export function isDrop(e: unknown): boolean {
	if (e instanceof DOMException && e.name === 'AbortError') return false;
	if (e instanceof TypeError) return true; // fetch's "network error" while reading the body
	return (e as { kind?: string })?.kind === 'network';
}
