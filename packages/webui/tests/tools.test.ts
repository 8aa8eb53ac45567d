import { afterEach, describe, expect, it, vi } from 'vitest';
import { ApiClient } from '../src/lib/services/api';
import {
	callTool,
	listTools,
	mergeToolCalls,
	parseArguments,
	toolResultText
} from '../src/lib/services/tools';

afterEach(() => vi.unstubAllGlobals());

describe('tools', () => {
	it('joins streamed tool-call parts by index', () => {
		let calls = mergeToolCalls([], [{ index: 0, id: 'a', function: { name: 'read_', arguments: '{"pa' } }]);
		calls = mergeToolCalls(calls, [
			{ index: 0, function: { name: 'file', arguments: 'th":1}' } },
			{ index: 1, id: 'b', function: { name: 'get_info' } }
		]);
		expect(calls).toEqual([
			{ id: 'a', name: 'read_file', arguments: '{"path":1}' },
			{ id: 'b', name: 'get_info', arguments: '' }
		]);
		expect(parseArguments(calls[0])).toEqual({ path: 1 });
		expect(parseArguments(calls[1])).toEqual({});
		expect(parseArguments({ id: '', name: '', arguments: '[1]' })).toMatch(/JSON object/);
	});

	it('turns results into tool message text as the contract says', () => {
		expect(toolResultText({ plain_text_response: 'a\n' })).toEqual({ ok: true, text: 'a\n' });
		expect(toolResultText({ error: 'cannot stat file: x' })).toEqual({
			ok: false,
			text: 'Error: cannot stat file: x'
		});
		expect(toolResultText({ os: 'Linux', cwd: '/' })).toEqual({ ok: true, text: '{"os":"Linux","cwd":"/"}' });
	});

	it('lists no tools when the feature is off and reports request errors to the model', async () => {
		const off = { error: { message: 'this feature is disabled', type: 'feature_disabled' } };
		vi.stubGlobal('fetch', async () => new Response(JSON.stringify(off), { status: 403 }));
		expect(await listTools(new ApiClient('http://s/'))).toEqual([]);
		const bad = { code: 400, message: 'unknown tool "x"', type: 'invalid_request_error' };
		vi.stubGlobal('fetch', async () => new Response(JSON.stringify(bad), { status: 404 }));
		const r = await callTool(new ApiClient('http://s/'), 'x', {});
		expect(r.ok).toBe(false);
		expect(r.text).toMatch(/unknown tool "x"/);
	});
});
