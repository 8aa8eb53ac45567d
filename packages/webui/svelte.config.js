import adapter from '@sveltejs/adapter-static';
import { vitePreprocess } from '@sveltejs/vite-plugin-svelte';

// The build goes into the Python package, whose committed copy `llama-server` serves.
// WEBUI_OUT builds elsewhere (the nox session compares a fresh build with the committed files).
const out = process.env.WEBUI_OUT ?? 'src/llama_webui/static';

/** @type {import('@sveltejs/kit').Config} */
const config = {
	preprocess: vitePreprocess(),
	kit: {
		adapter: adapter({ pages: out, assets: out, fallback: 'index.html', precompress: false, strict: true }),
		files: { assets: 'static' },
		// a fixed version name (not the build time): the same sources give the same files
		version: { name: '0.1.0', pollInterval: 0 }
	}
};

export default config;
