/** Read attached files: text files and PDFs become text, images become data URLs (vision models only). */
import type { Attachment } from '$lib/types';

const TEXT_TYPES = /^(text\/|application\/(json|xml|javascript|x-sh|x-python|toml|yaml|x-yaml))/;
const TEXT_EXTENSIONS =
	/\.(txt|md|markdown|csv|tsv|json|jsonl|xml|html?|css|js|mjs|ts|py|rs|c|h|cpp|hpp|go|java|sh|toml|ya?ml|ini|log|sql)$/i;

export type FileKind = 'text' | 'pdf' | 'image' | 'unsupported';

export function fileKind(name: string, type: string): FileKind {
	if (type === 'application/pdf' || /\.pdf$/i.test(name)) return 'pdf';
	if (type.startsWith('image/')) return 'image';
	if (TEXT_TYPES.test(type) || TEXT_EXTENSIONS.test(name)) return 'text';
	return 'unsupported';
}

/** The text of every page of a PDF (pdf.js, loaded only when a PDF is attached). */
async function pdfText(data: ArrayBuffer): Promise<string> {
	const pdfjs = await import('pdfjs-dist');
	const worker = await import('pdfjs-dist/build/pdf.worker.min.mjs?url');
	pdfjs.GlobalWorkerOptions.workerSrc = worker.default;
	const doc = await pdfjs.getDocument({ data }).promise;
	const pages: string[] = [];
	for (let i = 1; i <= doc.numPages; i++) {
		const content = await (await doc.getPage(i)).getTextContent();
		pages.push(content.items.map((item) => ('str' in item ? item.str : '')).join(' '));
	}
	return pages.join('\n\n');
}

function dataUrl(file: File): Promise<string> {
	return new Promise((resolve, reject) => {
		const reader = new FileReader();
		reader.onload = () => resolve(reader.result as string);
		reader.onerror = () => reject(reader.error);
		reader.readAsDataURL(file);
	});
}

/** Read one file as an attachment; throws with a message for people when it cannot be sent. */
export async function readAttachment(file: File, vision: boolean): Promise<Attachment> {
	const kind = fileKind(file.name, file.type);
	if (kind === 'text') return { name: file.name, kind: 'text', content: await file.text() };
	if (kind === 'pdf')
		return { name: file.name, kind: 'text', content: await pdfText(await file.arrayBuffer()) };
	if (kind === 'image') {
		if (!vision) throw new Error(`${file.name}: this model does not take images.`);
		return { name: file.name, kind: 'image', content: await dataUrl(file) };
	}
	throw new Error(`${file.name}: only text files, PDFs and images can be attached.`);
}
