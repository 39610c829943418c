// VList is a virtualised list: only the rows in view exist in the page, so
// hundreds of thousands of items scroll as smoothly as ten. Rows have one
// fixed height. While scrolled to the bottom it follows new items.
export class VList {
  // el: the scrolling container; render(item, rowEl) fills a row.
  constructor(el, {rowHeight = 22, render, onclick}) {
    this.el = el;
    this.rowHeight = rowHeight;
    this.render = render;
    this.items = [];
    this.pool = [];
    this.follow = true;
    this.frame = 0;
    el.classList.add('vlist');
    this.spacer = document.createElement('div');
    this.spacer.className = 'spacer-y';
    this.rows = document.createElement('div');
    this.rows.className = 'rows';
    el.append(this.spacer, this.rows);
    el.addEventListener('scroll', () => {
      this.follow = el.scrollTop + el.clientHeight >= el.scrollHeight - this.rowHeight;
      this.schedule();
    }, {passive: true});
    if (onclick) {
      this.rows.addEventListener('click', (e) => {
        const row = e.target.closest('.vrow');
        if (row && row._item !== undefined) onclick(row._item, row);
      });
    }
    new ResizeObserver(() => this.schedule()).observe(el);
  }

  // setItems replaces the list (the array is kept and may grow: call
  // changed() after appending to it).
  setItems(items) {
    this.items = items;
    this.changed();
  }

  changed() { this.schedule(); }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => { this.frame = 0; this.draw(); });
  }

  draw() {
    const n = this.items.length, rh = this.rowHeight, el = this.el;
    this.spacer.style.height = (n * rh) + 'px';
    if (this.follow) el.scrollTop = el.scrollHeight;
    const first = Math.max(0, Math.floor(el.scrollTop / rh) - 5);
    const visible = Math.ceil(el.clientHeight / rh) + 10;
    const last = Math.min(n, first + visible);
    while (this.pool.length < last - first) {
      const r = document.createElement('div');
      r.className = 'vrow';
      this.rows.appendChild(r);
      this.pool.push(r);
    }
    this.rows.style.transform = `translateY(${first * rh}px)`;
    for (let i = 0; i < this.pool.length; i++) {
      const r = this.pool[i], idx = first + i;
      if (idx < last) {
        r.hidden = false;
        if (r._item !== this.items[idx]) {
          r._item = this.items[idx];
          r._index = idx;
          this.render(r._item, r);
        }
      } else {
        r.hidden = true;
        r._item = undefined;
      }
    }
  }
}
