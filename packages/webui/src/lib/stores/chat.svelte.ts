/** Sending messages and streaming replies into the open conversation. */
import { ApiError, type ApiClient } from '$lib/services/api';
import { toRequestMessages } from '$lib/services/prompt';
import { pathTo } from '$lib/services/tree';
import type { Attachment, SamplingParams } from '$lib/types';
import type { ConversationStore } from './conversations.svelte';
import type { SettingsStore } from './settings.svelte';

/** The request's sampling fields (a negative max_tokens means no limit: left out). */
export function requestParams(s: SamplingParams): Partial<SamplingParams> {
	const { max_tokens, ...rest } = s;
	return max_tokens > 0 ? { ...rest, max_tokens } : rest;
}

export class ChatController {
	/** id of the reply being streamed */
	streaming = $state<string | null>(null);
	error = $state<ApiError | Error | null>(null);
	private abort: AbortController | null = null;

	constructor(
		private convs: ConversationStore,
		private settings: SettingsStore,
		private api: ApiClient
	) {}

	async send(text: string, attachments: Attachment[] = []): Promise<void> {
		if (this.streaming) return;
		this.error = null;
		try {
			if (!this.convs.active) await this.convs.create();
			const parent = this.convs.active!.currentLeaf;
			const user = await this.convs.add('user', text, parent, attachments.length ? { attachments } : {});
			await this.reply(user.id);
		} catch (e) {
			this.error = e instanceof Error ? e : new Error(String(e)); // e.g. the browser's storage is full
		}
	}

	/** Edit a message as a new version beside the old one; an edited user message gets a new reply. */
	async edit(id: string, text: string): Promise<void> {
		const old = this.convs.messages.find((m) => m.id === id);
		if (!old || this.streaming) return;
		const extra = old.attachments ? { attachments: $state.snapshot(old.attachments) as Attachment[] } : {};
		const msg = await this.convs.add(old.role, text, old.parent, extra);
		if (msg.role === 'user') await this.reply(msg.id);
	}

	/** A new reply to the same question, kept beside the old one. */
	async regenerate(id: string): Promise<void> {
		const old = this.convs.messages.find((m) => m.id === id);
		if (old?.parent && !this.streaming) await this.reply(old.parent);
	}

	stop(): void {
		this.abort?.abort();
	}

	private async reply(parent: string): Promise<void> {
		const thread = pathTo(this.convs.messages, parent);
		const msg = await this.convs.add('assistant', '', parent);
		this.streaming = msg.id;
		this.error = null;
		this.abort = new AbortController();
		let content = '';
		let reasoning = '';
		try {
			const messages = toRequestMessages(thread, this.settings.value.systemPrompt);
			const params = requestParams(this.settings.sampling);
			for await (const d of this.api.chat(messages, params, this.abort.signal)) {
				if (d.content) content += d.content;
				if (d.reasoning) reasoning += d.reasoning;
				this.convs.patch(msg.id, {
					content,
					...(reasoning ? { reasoning } : {}),
					...(d.timings ? { timings: d.timings } : {})
				});
			}
		} catch (e) {
			if (this.abort.signal.aborted) this.convs.patch(msg.id, { status: 'stopped' });
			else {
				this.error = e instanceof Error ? e : new Error(String(e));
				this.convs.patch(msg.id, { status: 'error' });
			}
		} finally {
			await this.convs.save(msg.id);
			this.streaming = null;
			this.abort = null;
		}
	}
}

export { ApiError };
