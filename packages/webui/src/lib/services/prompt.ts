/**
 * The request messages for a branch: the system prompt, then each message with its attachments; an
 * assistant's tool calls and the `tool` messages that answer them in OpenAI's shape.
 */
import type { ChatMessage, ContentPart } from './api';
import type { Message } from '$lib/types';

export function toRequestMessages(thread: Message[], systemPrompt: string): ChatMessage[] {
	const out: ChatMessage[] = [];
	if (systemPrompt.trim()) out.push({ role: 'system', content: systemPrompt });
	for (const m of thread) {
		if (m.role === 'tool') {
			out.push({ role: 'tool', tool_call_id: m.toolCallId ?? '', content: m.content });
			continue;
		}
		if (m.toolCalls?.length) {
			out.push({
				role: 'assistant',
				content: m.content,
				tool_calls: m.toolCalls.map((c) => ({
					id: c.id,
					type: 'function',
					function: { name: c.name, arguments: c.arguments }
				}))
			});
			continue;
		}
		const files = m.attachments ?? [];
		const texts = files.filter((a) => a.kind === 'text');
		const images = files.filter((a) => a.kind === 'image');
		let text = m.content;
		if (texts.length) {
			text = texts.map((a) => `File ${a.name}:\n\`\`\`\n${a.content}\n\`\`\``).join('\n\n') + '\n\n' + text;
		}
		if (images.length) {
			const parts: ContentPart[] = images.map((a) => ({ type: 'image_url', image_url: { url: a.content } }));
			parts.push({ type: 'text', text });
			out.push({ role: m.role, content: parts });
		} else out.push({ role: m.role, content: text });
	}
	return out;
}
