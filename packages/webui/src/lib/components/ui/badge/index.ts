import Root, { badgeVariants, type BadgeVariant } from './badge.svelte';

export { Root, Root as Badge, badgeVariants, type BadgeVariant };
