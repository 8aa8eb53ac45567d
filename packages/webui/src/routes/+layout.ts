// a single-page app: rendered in the browser only, served as one index.html by llama-server
export const ssr = false;
export const prerender = false;
