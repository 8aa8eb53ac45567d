/** The data the app keeps: conversations and their message trees (IndexedDB), settings (localStorage). */

export type Role = 'system' | 'user' | 'assistant' | 'tool';

/** A file attached to a user message: its text (text files, PDFs) or a data URL (images). */
export interface Attachment {
	name: string;
	kind: 'text' | 'image';
	/** the file's text, or a `data:image/...;base64,` URL */
	content: string;
}

/** Generation speed from the server's `timings` object. */
export interface Timings {
	prompt_n?: number;
	prompt_ms?: number;
	predicted_n?: number;
	predicted_ms?: number;
	predicted_per_second?: number;
}

/** A tool call the model made (OpenAI shape, flattened): `arguments` is the JSON text the model wrote. */
export interface ToolCall {
	id: string;
	name: string;
	arguments: string;
}

/** Where a reply's resumable stream is: the `X-Conversation-Id` it was sent with and the bytes read. */
export interface StreamPosition {
	id: string;
	offset: number;
}

/**
 * One message. Messages form a tree per conversation: editing a message or regenerating a reply adds a
 * sibling (same parent), and the conversation's `currentLeaf` picks the branch on screen.
 */
export interface Message {
	id: string;
	convId: string;
	parent: string | null;
	role: Role;
	content: string;
	reasoning?: string;
	attachments?: Attachment[];
	timings?: Timings;
	/**
	 * `streaming` while a reply is being generated (kept in IndexedDB, so a reload finds unfinished
	 * replies); `stopped` or `error` when it ended so
	 */
	status?: 'streaming' | 'stopped' | 'error';
	/** a reply's resumable stream (set while it streams) */
	stream?: StreamPosition;
	/** the reply was re-attached to its stream after a reload or a dropped connection */
	resumed?: boolean;
	/** the tools an assistant message called */
	toolCalls?: ToolCall[];
	/** a tool message: which call it answers, and the tool's name */
	toolCallId?: string;
	toolName?: string;
	/** a tool message: the user refused to run it, or it failed */
	toolOutcome?: 'done' | 'denied' | 'error';
	createdAt: number;
}

export interface Conversation {
	id: string;
	name: string;
	/** the last message of the branch on screen */
	currentLeaf: string | null;
	createdAt: number;
	updatedAt: number;
}

/** The export file: one or more conversations with all their messages (every branch). */
export interface ConversationExport {
	format: 'llama-webui/conversations';
	version: 1;
	conversations: { conversation: Conversation; messages: Message[] }[];
}

/** Sampling parameters sent with every request (the server's names). */
export interface SamplingParams {
	temperature: number;
	top_k: number;
	top_p: number;
	min_p: number;
	max_tokens: number;
	repeat_penalty: number;
	presence_penalty: number;
	frequency_penalty: number;
	seed: number;
}

export type Theme = 'system' | 'light' | 'dark';

export interface Settings {
	theme: Theme;
	apiKey: string;
	systemPrompt: string;
	showReasoning: boolean;
	/** offer the server's tools (`/tools`) to the model and run the calls it makes */
	useTools: boolean;
	/** router mode: the model replies come from (a name from `/models`) */
	model: string;
	/** values the user changed; the rest come from the server's defaults */
	sampling: Partial<SamplingParams>;
}
