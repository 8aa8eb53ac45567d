import { sveltekit } from '@sveltejs/kit/vite';
import tailwindcss from '@tailwindcss/vite';
import { defineConfig } from 'vitest/config';

// `npm run dev` sends the API calls to a running llama-server
const api = process.env.LLAMA_SERVER_URL ?? 'http://127.0.0.1:8080';

export default defineConfig({
	plugins: [tailwindcss(), sveltekit()],
	server: { proxy: Object.fromEntries(['/v1', '/props', '/health'].map((path) => [path, api])) },
	build: { chunkSizeWarningLimit: 2000 },
	test: {
		include: ['tests/**/*.test.ts'],
		environment: 'node',
		setupFiles: ['tests/setup.ts']
	}
});
