// IndexedDB for Dexie under Node
import 'fake-indexeddb/auto';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ApiClient, ApiError } from '../src/lib/services/api';
import { ChatDatabase } from '../src/lib/services/db';
import { ChatController, type ChatEnv } from '../src/lib/stores/chat.svelte';
import { ConversationStore } from '../src/lib/stores/conversations.svelte';
import { SettingsStore } from '../src/lib/stores/settings.svelte';
import { ContractServer, serverTool, text, toolCall } from './contract-server';

let n = 0;
let db: string;
let convs: ConversationStore;
let settings: SettingsStore;
let server: ContractServer;

beforeEach(async () => {
	db = `chat-${n++}`;
	convs = new ConversationStore(new ChatDatabase(db));
	settings = new SettingsStore(undefined);
	server = new ContractServer();
	vi.stubGlobal('fetch', server.fetch);
});

afterEach(() => vi.unstubAllGlobals());

const controller = (env?: ChatEnv) =>
	new ChatController(convs, settings, new ApiClient('http://server/'), env);
const until = async (cond: () => boolean) => {
	while (!cond()) await new Promise((r) => setTimeout(r, 1));
};

describe('ChatController', () => {
	it('streams a reply with its reasoning and speed into a new conversation', async () => {
		server.replies = [
			[
				{ choices: [{ delta: { reasoning_content: 'Think.' } }] },
				text('Hel'),
				{ ...text('lo'), timings: { predicted_per_second: 9 } }
			]
		];
		settings.update({ systemPrompt: 'Be kind.' });
		await controller().send('Hi');
		expect(convs.thread.map((m) => [m.role, m.content])).toEqual([
			['user', 'Hi'],
			['assistant', 'Hello']
		]);
		expect(convs.thread[1].reasoning).toBe('Think.');
		expect(convs.thread[1].timings?.predicted_per_second).toBe(9);
		expect(convs.thread[1].status).toBeUndefined();
		expect(convs.thread[1].stream).toBeUndefined();
		expect(server.requests[0].body.messages).toEqual([
			{ role: 'system', content: 'Be kind.' },
			{ role: 'user', content: 'Hi' }
		]);
		// the conversation's id is its stream id
		expect(server.requests[0].streamId).toBe(convs.activeId);
	});

	it('stops mid-stream, keeps what arrived and stops the server too', async () => {
		server.replies = [Array.from({ length: 50 }, () => text('x'))];
		const chat = controller();
		const sending = chat.send('Long, please');
		await until(() => Boolean(convs.thread[1]?.content));
		chat.stop();
		await sending;
		const reply = convs.thread[1];
		expect(reply.status).toBe('stopped');
		expect(reply.content.length).toBeGreaterThan(0);
		expect(reply.content.length).toBeLessThan(50);
		expect(chat.streaming).toBeNull();
		await until(() => !server.sessions.size); // the DELETE went out
	});

	it('regenerates and edits as new branches', async () => {
		const chat = controller();
		server.replies = [[text('A')]];
		await chat.send('Q');
		const [q, a] = convs.thread;
		server.replies = [[text('B')]];
		await chat.regenerate(a.id);
		expect(convs.thread.map((m) => m.content)).toEqual(['Q', 'B']);
		expect(convs.versions(convs.thread[1].id).ids).toHaveLength(2);
		server.replies = [[text('C')]];
		await chat.edit(q.id, 'Q2');
		expect(convs.thread.map((m) => m.content)).toEqual(['Q2', 'C']);
		await convs.switchTo(q.id);
		expect(convs.thread.map((m) => m.content)).toEqual(['Q', 'B']);
	});

	it('reports errors such as a full context', async () => {
		const body = { error: { code: 400, message: 'too long', type: 'exceed_context_size_error' } };
		vi.stubGlobal('fetch', async () => new Response(JSON.stringify(body), { status: 400 }));
		const chat = controller();
		await chat.send('Q');
		expect(chat.error).toBeInstanceOf(ApiError);
		expect((chat.error as ApiError).kind).toBe('context');
		expect(convs.thread[1].status).toBe('error');
	});
});

describe('resumable replies', () => {
	const words = Array.from({ length: 30 }, (_, i) => text(`w${i} `));
	const whole = words.map((w) => w.choices[0].delta.content).join('');

	it('re-attaches after a dropped connection and finishes the reply in place', async () => {
		server.replies = [words];
		server.dropAfter = 500; // the connection dies mid-reply; the generation goes on
		await controller().send('Count');
		expect(convs.thread[1].content).toBe(whole);
		expect(convs.thread[1].status).toBeUndefined();
		expect(server.requests).toHaveLength(1); // resumed, not asked again
		expect(convs.thread[1].resumed).toBe(true);
	});

	it('after a reload, looks the reply up and replays it from the saved offset', async () => {
		server.delay = 20; // slow enough for a save or two before the "reload"
		server.replies = [words];
		const page = new ChatController(convs, settings, new ApiClient('http://page1/'));
		void page.send('Count');
		await until(() => (convs.thread[1]?.stream?.offset ?? 0) > 0 && convs.thread[1].content.length > 10);
		await new Promise((r) => setTimeout(r, 300)); // a save happened
		// the page goes away (its requests never go on); a new page opens on the same database
		server.gone.add('page1');
		const saved = (await convs.unfinished())[0];
		expect(saved.status).toBe('streaming');
		expect(saved.stream!.offset).toBeGreaterThan(0);
		const reloaded = new ConversationStore(new ChatDatabase(db));
		await reloaded.load();
		await reloaded.open(saved.convId);
		const chat = new ChatController(reloaded, settings, new ApiClient('http://server/'));
		await chat.resumeAll();
		const reply = reloaded.messages.find((m) => m.id === saved.id)!;
		expect(saved.content.length).toBeGreaterThan(0);
		expect(saved.content.length).toBeLessThan(whole.length); // saved mid-reply, the rest replayed
		expect(reply.content).toBe(whole);
		expect(reply.status).toBeUndefined();
		expect(await reloaded.unfinished()).toEqual([]);
	});

	it('does not retry a request that never got an answer (the server is down)', async () => {
		let calls = 0;
		vi.stubGlobal('fetch', async () => {
			calls++;
			throw new TypeError('Failed to fetch');
		});
		const chat = controller();
		await chat.send('Hi');
		expect(calls).toBe(1);
		expect((chat.error as ApiError).kind).toBe('network');
		expect(convs.thread[1].status).toBe('error');
	});

	it('leaves unfinished replies alone while the server is down or wants a key', async () => {
		const c = await convs.create();
		const u = await convs.add('user', 'Hi', null);
		await convs.add('assistant', 'Hal', u.id, { status: 'streaming', stream: { id: c.id, offset: 40 } });
		const auth = { error: { code: 401, message: 'Invalid API Key', type: 'authentication_error' } };
		vi.stubGlobal('fetch', async () => new Response(JSON.stringify(auth), { status: 401 }));
		await controller().resumeAll();
		vi.stubGlobal('fetch', async () => Promise.reject(new TypeError('Failed to fetch')));
		await controller().resumeAll();
		expect(await convs.unfinished()).toHaveLength(1);
	});

	it('marks a reply the server no longer has as stopped', async () => {
		const c = await convs.create();
		const u = await convs.add('user', 'Hi', null);
		await convs.add('assistant', 'Hal', u.id, { status: 'streaming', stream: { id: c.id, offset: 40 } });
		await controller().resumeAll();
		expect((await convs.messagesOf(c.id)).find((m) => m.role === 'assistant')?.status).toBe('stopped');
	});
});

describe('the agentic loop', () => {
	const env: ChatEnv = { tools: [serverTool('read_file', false), serverTool('write_file', true)], model: '' };

	it('runs a read tool, sends its result back as a tool message and gets the answer', async () => {
		server.replies = [[toolCall('c1', 'read_file', { path: 'a.txt' })], [text('It says hi.')]];
		server.toolResult = { plain_text_response: 'hi\n' };
		await controller(env).send('Read a.txt');
		expect(convs.thread.map((m) => m.role)).toEqual(['user', 'assistant', 'tool', 'assistant']);
		expect(convs.thread[1].toolCalls).toEqual([
			{ id: 'c1', name: 'read_file', arguments: '{"path":"a.txt"}' }
		]);
		expect(server.toolRuns).toEqual([{ tool: 'read_file', params: { path: 'a.txt' } }]);
		expect(server.requests[0].body.tools).toEqual(env.tools.map((t) => t.definition));
		expect(server.requests[1].body.messages).toEqual([
			{ role: 'user', content: 'Read a.txt' },
			{
				role: 'assistant',
				content: '',
				tool_calls: [
					{ id: 'c1', type: 'function', function: { name: 'read_file', arguments: '{"path":"a.txt"}' } }
				]
			},
			{ role: 'tool', tool_call_id: 'c1', content: 'hi\n' }
		]);
		expect(convs.thread[3].content).toBe('It says hi.');
	});

	it('asks before a write tool; a denial goes back to the model, nothing runs', async () => {
		server.replies = [[toolCall('c1', 'write_file', { path: 'b.txt', content: 'x' })], [text('Fine.')]];
		const chat = controller(env);
		const sending = chat.send('Write b.txt');
		await until(() => chat.permission !== null);
		expect(chat.permission!.tool.tool).toBe('write_file');
		expect(chat.busy).toBe(true);
		chat.permission!.answer('deny');
		await sending;
		expect(server.toolRuns).toEqual([]);
		expect(convs.thread[2]).toMatchObject({ role: 'tool', toolOutcome: 'denied' });
		expect(convs.thread[3].content).toBe('Fine.');
	});

	it('runs an allowed write tool; "always" does not ask again in the conversation', async () => {
		const call = toolCall('c1', 'write_file', { path: 'b.txt', content: 'x' });
		server.replies = [
			[call],
			[toolCall('c2', 'write_file', { path: 'c.txt', content: 'y' })],
			[text('Done.')]
		];
		server.toolResult = { result: 'file written successfully', path: 'b.txt', bytes: 1 };
		const chat = controller(env);
		const sending = chat.send('Write two files');
		await until(() => chat.permission !== null);
		chat.permission!.answer('always');
		await sending;
		expect(server.toolRuns.map((r) => r.params)).toEqual([
			{ path: 'b.txt', content: 'x' },
			{ path: 'c.txt', content: 'y' }
		]);
		// a result other than plain text goes back as JSON
		expect(convs.thread[2].content).toBe(JSON.stringify(server.toolResult));
		expect(convs.thread.at(-1)!.content).toBe('Done.');
	});

	it('the user can stop the loop at the permission prompt', async () => {
		server.replies = [[toolCall('c1', 'write_file', { path: 'b.txt', content: 'x' })], [text('never')]];
		const chat = controller(env);
		const sending = chat.send('Write b.txt');
		await until(() => chat.permission !== null);
		chat.stop();
		await sending;
		expect(chat.permission).toBeNull();
		expect(chat.busy).toBe(false);
		expect(server.toolRuns).toEqual([]);
		expect(server.requests).toHaveLength(1);
	});

	it('tells the model about an unknown tool and bad arguments', async () => {
		server.replies = [
			[toolCall('c1', 'launch_rocket', {})],
			[
				{
					choices: [
						{
							delta: { tool_calls: [{ index: 0, id: 'c2', function: { name: 'read_file', arguments: '{' } }] }
						}
					]
				}
			],
			[text('Sorry.')]
		];
		await controller(env).send('Go');
		const tools = convs.thread.filter((m) => m.role === 'tool');
		expect(tools.map((m) => m.toolOutcome)).toEqual(['error', 'error']);
		expect(tools[0].content).toMatch(/no tool named "launch_rocket"/);
		expect(tools[1].content).toMatch(/not valid JSON/);
	});

	it('offers no tools when the setting is off', async () => {
		settings.update({ useTools: false });
		server.replies = [[text('Hi')]];
		await controller(env).send('Hello');
		expect(server.requests[0].body.tools).toBeUndefined();
	});
});
