/** Helpers of the UI kit (shadcn-svelte's conventions): class merging and element-ref props. */
import { clsx, type ClassValue } from 'clsx';
import { twMerge } from 'tailwind-merge';

/** Join class values; a later Tailwind class wins over an earlier one of the same kind. */
export function cn(...inputs: ClassValue[]): string {
	return twMerge(clsx(inputs));
}

export type WithElementRef<T, U extends HTMLElement = HTMLElement> = T & { ref?: U | null };
