// Renders a diff answer: its counts, and a change's unified diff line by
// line, or what is known of a binary or unreadable file.
import {h, bytes} from './util.js';

// diffCounts sums a diff answer up in one line.
export function diffCounts(d) {
  const s = `${d.added} added, ${d.modified} modified, ${d.deleted} deleted`;
  return d.truncated ? `${s} (truncated: some changed paths were not read)` : s;
}

export function renderDiff(c) {
  if (!c.diff) {
    const what = c.kind === 'modified' ? `${bytes(c.old_size)} → ${bytes(c.size)}` : bytes(c.size);
    return h('p', {class: 'muted', id: 'diff-none'}, `${c.kind} ${c.type} (${what}); no text diff (binary, too large, or not a regular file).` +
      (c.sha256 ? ` sha256 ${c.sha256}` : ''));
  }
  const lines = c.diff.replace(/\n$/, '').split('\n');
  return h('div', {class: 'diff', 'data-path': c.path}, lines.map((l) => {
    let cls = '';
    if (l.startsWith('+++') || l.startsWith('---')) cls = 'meta';
    else if (l.startsWith('@@')) cls = 'hunk';
    else if (l.startsWith('+')) cls = 'add';
    else if (l.startsWith('-')) cls = 'del';
    return h('div', {class: cls}, l || ' ');
  }));
}
