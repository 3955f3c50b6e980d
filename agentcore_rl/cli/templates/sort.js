// Sort a table by the clicked column (numbers by data-v when present); click again to reverse.
document.querySelectorAll("table.sortable th").forEach((th, col) => th.addEventListener("click", () => {
  const body = th.closest("table").tBodies[0], up = th.dataset.dir !== "up";
  const key = (tr) => { const td = tr.cells[col], v = td.dataset.v;
    return v !== undefined && v !== "" ? parseFloat(v) : v === "" ? -Infinity : td.textContent; };
  const rows = [...body.rows].sort((a, b) => { const x = key(a), y = key(b);
    return (x > y ? 1 : x < y ? -1 : 0) * (up ? 1 : -1); });
  th.dataset.dir = up ? "up" : "down"; rows.forEach((r) => body.appendChild(r));
}));
