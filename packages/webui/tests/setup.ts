// IndexedDB for Dexie under Node
import 'fake-indexeddb/auto';
