// A small modal form: ask('Create a jail', [{name, label, value, type, options}])
// resolves to the values, or null when cancelled.
import {h} from './util.js';

export function ask(title, fields, okLabel) {
  return new Promise((resolve) => {
    const inputs = {};
    const body = fields.map((f) => {
      const id = 'f-' + f.name;
      let input;
      if (f.options) {
        input = h('select', {id, name: f.name}, f.options.map(o => h('option', {value: o, selected: o === f.value}, o)));
      } else {
        input = h('input', {id, name: f.name, type: f.type || 'text', value: f.value ?? '', placeholder: f.placeholder || '', min: f.min, max: f.max});
      }
      inputs[f.name] = input;
      return [h('label', {for: id}, f.label), input];
    });
    const dlg = h('dialog', {class: 'ask'},
      h('form', {method: 'dialog'},
        h('h2', {}, title),
        body,
        h('div', {class: 'row'},
          h('button', {type: 'button', id: 'ask-cancel', onclick: () => { dlg.close(); }}, 'Cancel'),
          h('button', {type: 'submit', class: 'primary', id: 'ask-ok', value: 'ok'}, okLabel || 'OK'))));
    dlg.addEventListener('close', () => {
      const ok = dlg.returnValue === 'ok';
      const out = {};
      for (const [k, el] of Object.entries(inputs)) out[k] = el.value;
      dlg.remove();
      resolve(ok ? out : null);
    });
    document.body.appendChild(dlg);
    dlg.showModal();
  });
}

// confirmAction asks a yes/no question.
export async function confirmAction(title, okLabel) {
  return (await ask(title, [], okLabel)) !== null;
}
