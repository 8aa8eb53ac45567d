import { AlertDialog as AlertDialogPrimitive } from 'bits-ui';
import Action from './alert-dialog-action.svelte';
import Cancel from './alert-dialog-cancel.svelte';
import Content from './alert-dialog-content.svelte';
import Description from './alert-dialog-description.svelte';
import Title from './alert-dialog-title.svelte';
import Footer from '../dialog/dialog-footer.svelte';

const Root = AlertDialogPrimitive.Root;

export { Root, Content, Title, Description, Footer, Action, Cancel };
