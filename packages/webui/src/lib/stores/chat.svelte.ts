/**
 * Sending messages and streaming replies: resumable streams (a reload, a closed tab or a dropped
 * connection re-attaches to the live generation and the reply finishes in place) and the agentic loop
 * (the model's tool calls run through the server's `/tools`, write tools only after the user allows
 * them, results go back as `tool` messages until the model answers or the user stops).
 */
import { ApiError, type ApiClient, type StreamStep } from '$lib/services/api';
import { toRequestMessages } from '$lib/services/prompt';
import { applyStep, finished, isDrop, streamIdFor } from '$lib/services/reply';
import { callTool, parseArguments, type ServerTool } from '$lib/services/tools';
import { pathTo } from '$lib/services/tree';
import type { Attachment, Message, SamplingParams, ToolCall } from '$lib/types';
import type { ConversationStore } from './conversations.svelte';
import type { SettingsStore } from './settings.svelte';

/** The request's sampling fields (a negative max_tokens means no limit: left out). */
export function requestParams(s: SamplingParams): Partial<SamplingParams> {
	const { max_tokens, ...rest } = s;
	return max_tokens > 0 ? { ...rest, max_tokens } : rest;
}

/** What the chat needs from the server: its tools and, in router mode, the chosen model. */
export interface ChatEnv {
	tools: ServerTool[];
	model: string;
}

/** A write tool waiting for the user's answer. */
export interface PermissionRequest {
	convId: string;
	call: ToolCall;
	tool: ServerTool;
	answer: (a: PermissionAnswer) => void;
}

export type PermissionAnswer = 'once' | 'always' | 'deny' | 'stop';

/** One conversation's work in progress: a reply streaming, tools running or a permission asked. */
interface Run {
	abort: AbortController;
	streamId: string;
	/** the reply being streamed, if any */
	msgId: string | null;
}

/** The most model turns one message may start (each tool round is one turn). */
export const MAX_TURNS = 12;
/** Saving a streaming reply at most this often (ms): what a reload resumes from. */
const SAVE_EVERY_MS = 250;
/** How often a dropped stream is re-attached before the reply is given up. */
const MAX_RETRIES = 8;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class ChatController {
	/** work in progress per conversation id */
	runs = $state<Record<string, Run>>({});
	error = $state<ApiError | Error | null>(null);
	permission = $state<PermissionRequest | null>(null);
	/** `<conversation>\u0000<tool>` pairs the user allowed for the rest of the conversation */
	private allowed = new Set<string>();

	constructor(
		private convs: ConversationStore,
		private settings: SettingsStore,
		private api: ApiClient,
		private env: ChatEnv = { tools: [], model: '' }
	) {}

	/** The reply streaming in the open conversation. */
	get streaming(): string | null {
		return this.runs[this.convs.activeId ?? '']?.msgId ?? null;
	}

	/** Whether the open conversation has work in progress (a reply or a tool round). */
	get busy(): boolean {
		return Boolean(this.runs[this.convs.activeId ?? '']);
	}

	async send(text: string, attachments: Attachment[] = []): Promise<void> {
		if (this.busy) return;
		this.error = null;
		try {
			if (!this.convs.active) await this.convs.create();
			const parent = this.convs.active!.currentLeaf;
			const user = await this.convs.add('user', text, parent, attachments.length ? { attachments } : {});
			await this.run(user.convId, user.id);
		} catch (e) {
			this.error = e instanceof Error ? e : new Error(String(e)); // e.g. the browser's storage is full
		}
	}

	/** Edit a message as a new version beside the old one; an edited user message gets a new reply. */
	async edit(id: string, text: string): Promise<void> {
		const old = this.convs.messages.find((m) => m.id === id);
		if (!old || this.busy) return;
		const extra = old.attachments ? { attachments: $state.snapshot(old.attachments) as Attachment[] } : {};
		const msg = await this.convs.add(old.role, text, old.parent, extra);
		if (msg.role === 'user') await this.run(msg.convId, msg.id);
	}

	/** A new reply to the same question, kept beside the old one. */
	async regenerate(id: string): Promise<void> {
		const old = this.convs.messages.find((m) => m.id === id);
		if (old?.parent && !this.busy) await this.run(old.convId, old.parent);
	}

	/** Stop the open conversation's reply and tool loop; the server stops generating too. */
	stop(): void {
		const convId = this.convs.activeId ?? '';
		const run = this.runs[convId];
		if (!run) return;
		run.abort.abort();
		if (this.permission?.convId === convId) this.permission.answer('stop');
		if (run.msgId) this.api.stopStream(run.streamId).catch(() => {}); // an older server: nothing to stop
	}

	/**
	 * After a reload: find the replies that were still streaming, ask the server which of their
	 * generations it still has, and finish those in place from the last saved byte offset. The others
	 * are marked stopped (the server restarted, or the session expired).
	 */
	async resumeAll(): Promise<void> {
		const pending = await this.convs.unfinished();
		if (!pending.length) return;
		// only the newest reply of a stream id can still be live
		const newest = new Map<string, Message>();
		for (const m of pending.sort((a, b) => a.createdAt - b.createdAt))
			if (m.stream) newest.set(m.stream.id, m);
		let live: Set<string>;
		try {
			const found = newest.size ? await this.api.lookupStreams([...newest.keys()]) : [];
			live = new Set(found.map((s) => s.conversation_id));
		} catch (e) {
			// the server is down, or wants a key first: try again later
			if (isDrop(e) || (e instanceof ApiError && e.kind === 'auth')) return;
			live = new Set(); // a server without resumable streams
		}
		const resumes: Promise<void>[] = [];
		for (const m of pending) {
			const id = m.stream?.id;
			if (this.runs[m.convId]) continue; // already followed here
			if (id && live.has(id) && newest.get(id) === m && m.parent)
				resumes.push(this.run(m.convId, m.parent, m));
			else await this.convs.put(finished(m, 'stopped'));
		}
		await Promise.all(resumes);
	}

	/**
	 * One conversation's turns: a reply (new, or `resume`d from its saved offset), then while it calls
	 * tools, a tool round and the next reply.
	 */
	private async run(convId: string, parent: string, resume?: Message): Promise<void> {
		const streamId = resume?.stream?.id ?? streamIdFor(convId, this.env.model);
		this.runs[convId] = { abort: new AbortController(), streamId, msgId: null };
		const run = this.runs[convId]; // the reactive proxy: the UI sees msgId change
		this.error = null;
		try {
			for (let turn = 0; turn < MAX_TURNS; turn++) {
				const reply = resume ? await this.resumeReply(run, resume) : await this.reply(run, convId, parent);
				resume = undefined;
				if (reply.status || run.abort.signal.aborted || !reply.toolCalls?.length) return;
				const last = await this.toolRound(run, reply);
				if (!last) return;
				parent = last;
			}
		} catch (e) {
			if (!run.abort.signal.aborted) this.error = e instanceof Error ? e : new Error(String(e));
		} finally {
			delete this.runs[convId];
		}
	}

	private tools(): ServerTool[] {
		return this.settings.value.useTools ? this.env.tools : [];
	}

	/** A new reply under `parent`, streamed with the conversation's stream id. */
	private async reply(run: Run, convId: string, parent: string): Promise<Message> {
		const thread = pathTo(await this.convs.messagesOf(convId), parent);
		const msg = await this.convs.add(
			'assistant',
			'',
			parent,
			{ status: 'streaming', stream: { id: run.streamId, offset: 0 } },
			convId
		);
		const messages = toRequestMessages(thread, this.settings.value.systemPrompt);
		const params = requestParams(this.settings.sampling);
		const options = {
			streamId: run.streamId,
			tools: this.tools().map((t) => t.definition),
			model: this.env.model || undefined
		};
		return this.follow(run, msg, this.api.chat(messages, params, run.abort.signal, options));
	}

	/** Re-attach to a reply's stream from its saved offset. */
	private resumeReply(run: Run, msg: Message): Promise<Message> {
		const { id, offset } = msg.stream!;
		return this.follow(run, { ...msg, resumed: true }, this.api.resume(id, offset, run.abort.signal));
	}

	/**
	 * Read a reply's stream into the message, saving it (with the byte offset it has reached) every
	 * SAVE_EVERY_MS. A connection that drops once the reply is streaming re-attaches from that offset
	 * (a request that never got an answer is not retried: the server may never have seen it); a stop
	 * ends it as `stopped`.
	 */
	private async follow(run: Run, msg: Message, source: AsyncGenerator<StreamStep>): Promise<Message> {
		run.msgId = msg.id;
		let m = msg;
		let saved = Date.now();
		for (let retries = 0; ;) {
			let streaming = retries > 0;
			try {
				for await (const step of source) {
					m = applyStep(m, step);
					streaming = true;
					retries = 0;
					this.convs.patch(m.id, m);
					if (Date.now() - saved >= SAVE_EVERY_MS) {
						saved = Date.now();
						await this.convs.put(m);
					}
				}
				m = finished(m);
				break;
			} catch (e) {
				if (run.abort.signal.aborted) {
					m = finished(m, 'stopped');
					break;
				}
				if (isDrop(e) && m.stream && streaming && retries < MAX_RETRIES) {
					await sleep(Math.min(250 * 2 ** retries++, 4000));
					source = this.api.resume(m.stream.id, m.stream.offset, run.abort.signal);
					m = { ...m, resumed: true };
					continue;
				}
				this.error = e instanceof Error ? e : new Error(String(e));
				m = finished(m, 'error');
				break;
			}
		}
		run.msgId = null;
		await this.convs.put(m);
		return m;
	}

	/** Run a reply's tool calls in order; returns the last `tool` message's id, or null when stopped. */
	private async toolRound(run: Run, reply: Message): Promise<string | null> {
		let parent = reply.id;
		for (const call of reply.toolCalls ?? []) {
			const { text, outcome } = await this.runTool(run, reply.convId, call);
			if (run.abort.signal.aborted || outcome === 'stop') return null;
			const extra = { toolCallId: call.id, toolName: call.name, toolOutcome: outcome };
			parent = (await this.convs.add('tool', text, parent, extra, reply.convId)).id;
		}
		return parent;
	}

	private async runTool(
		run: Run,
		convId: string,
		call: ToolCall
	): Promise<{ text: string; outcome: 'done' | 'denied' | 'error' | 'stop' }> {
		const tool = this.env.tools.find((t) => t.definition.function.name === call.name);
		if (!tool) return { text: `Error: there is no tool named "${call.name}".`, outcome: 'error' };
		const args = parseArguments(call);
		if (typeof args === 'string') return { text: `Error: ${args}.`, outcome: 'error' };
		const key = `${convId}\u0000${tool.tool}`;
		if (tool.permissions?.write && !this.allowed.has(key)) {
			const answer = await this.ask(convId, call, tool);
			if (answer === 'stop') return { text: '', outcome: 'stop' };
			if (answer === 'deny') return { text: 'The user refused to run this tool call.', outcome: 'denied' };
			if (answer === 'always') this.allowed.add(key);
		}
		const result = await callTool(this.api, tool.tool, args, run.abort.signal);
		return { text: result.text, outcome: result.ok ? 'done' : 'error' };
	}

	/** Ask the user whether a write tool may run (the permission prompt shows `permission`). */
	private ask(convId: string, call: ToolCall, tool: ServerTool): Promise<PermissionAnswer> {
		return new Promise((resolve) => {
			this.permission = {
				convId,
				call,
				tool,
				answer: (a) => {
					this.permission = null;
					resolve(a);
				}
			};
		});
	}
}

export { ApiError };
