/* Explorers: controls, numbers and a chart over a grid that clusterlab computed when the book
   was built (lib/clusterlab/course/explorers.py writes the grid into the page as JSON). This
   script only looks numbers up in that grid; it computes no model of its own and fetches
   nothing. Served from the book's _static/ folder. */
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  // Okabe-Ito colours, told apart with colour-blindness too.
  const COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
                   "#F0E442", "#999999"];

  // Three significant digits; whole numbers as they are, and from 100 up.
  function format(x) {
    if (Number.isInteger(x) || Math.abs(x) >= 100) return Math.round(x).toLocaleString("en-US");
    return x === 0 ? "0" : x.toPrecision(3);
  }

  function element(tag, attributes, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function svgElement(tag, attributes, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  class Explorer {
    constructor(root, spec) {
      this.root = root;
      this.spec = spec;
      this.choice = spec.controls.map((c) => c.default);
      this.inputs = [];
      this.build();
      this.update();
      window.addEventListener("resize", () => this.drawChart());
    }

    build() {
      const spec = this.spec;
      this.root.append(element("p", { class: "cl-title" }, spec.title));
      const controls = element("div", { class: "cl-controls" });
      spec.controls.forEach((control, k) => {
        const id = `explorer-${spec.name}-${control.name}`;
        const box = element("div", { class: "cl-control" });
        const label = element("label", { for: id }, control.label + " ");
        let input;
        if (control.kind === "slider") {
          input = element("input", { type: "range", id: id, min: 0,
                                     max: control.options.length - 1, step: 1,
                                     value: control.default });
          const shown = element("output", { for: id, class: "cl-option" });
          label.append(shown);
          input.shownOption = shown;
        } else {
          input = element("select", { id: id });
          control.options.forEach((option, i) => input.append(
            element("option", { value: i }, option)));
          input.value = control.default;
        }
        input.dataset.control = control.name;
        input.addEventListener("input", () => {
          this.choice[k] = Number(input.value);
          this.update();
        });
        this.inputs.push(input);
        box.append(label, input);
        controls.append(box);
      });
      this.outputs = element("dl", { class: "cl-outputs", "aria-live": "polite" });
      this.values = spec.outputs.map((output) => {
        const item = element("div");
        const value = element("dd", { "data-output": output.name });
        item.append(element("dt", {}, output.label), value);
        this.outputs.append(item);
        return value;
      });
      this.error = element("p", { class: "cl-error", role: "status" });
      this.chart = svgElement("svg", { class: "cl-chart", role: "img" });
      this.legend = element("ul", { class: "cl-legend" });
      this.root.append(controls, this.outputs, this.error, this.chart, this.legend,
                       element("p", { class: "cl-note" }, spec.note));
    }

    cellAt(choice) {
      const cell = this.spec.cells[choice.join(",")];
      return typeof cell === "number" ? { error: this.spec.errors[cell] } : { values: cell };
    }

    update() {
      this.inputs.forEach((input, k) => {
        const option = this.spec.controls[k].options[this.choice[k]];
        if (input.shownOption) {
          input.shownOption.textContent = option;
          input.setAttribute("aria-valuetext", option);
        }
      });
      const cell = this.cellAt(this.choice);
      this.spec.outputs.forEach((output, k) => {
        const node = this.values[k];
        if (cell.error) {
          node.textContent = "–";
          node.removeAttribute("data-value");
          return;
        }
        const value = cell.values[k];
        node.dataset.value = value;
        node.textContent = output.kind === "text" ? value
          : format(value) + (output.unit ? " " + output.unit : "");
      });
      this.error.textContent = cell.error ? "No result here: " + cell.error : "";
      this.error.hidden = !cell.error;
      this.drawChart();
    }

    // The cells along the chart's control, the other controls as chosen.
    series() {
      const over = this.spec.controls.findIndex((c) => c.name === this.spec.chart.over);
      return this.spec.controls[over].options.map((label, i) => {
        const choice = this.choice.slice();
        choice[over] = i;
        return { label: label, cell: this.cellAt(choice), current: i === this.choice[over] };
      });
    }

    outputIndex(name) {
      return this.spec.outputs.findIndex((o) => o.name === name);
    }

    drawChart() {
      const chart = this.spec.chart;
      const svg = this.chart;
      const width = Math.max(280, svg.clientWidth || this.root.clientWidth || 600);
      const height = 220;
      const box = { left: 56, right: width - 12, top: 22, bottom: height - 42 };
      svg.replaceChildren();
      svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
      svg.setAttribute("width", width);
      svg.setAttribute("height", height);
      const points = this.series();
      const stacks = chart.kind === "stacks";
      const parts = stacks ? chart.parts.map((p) => this.outputIndex(p))
                           : [this.outputIndex(chart.y)];
      const totals = points.map((p) => p.cell.error ? null
        : parts.reduce((sum, k) => sum + p.cell.values[k], 0));
      const limit = chart.limit ? this.outputIndex(chart.limit) : -1;
      let top = Math.max(...totals.filter((t) => t !== null), 0);
      for (const p of points) {
        if (limit >= 0 && !p.cell.error) top = Math.max(top, p.cell.values[limit]);
      }
      top = top > 0 ? top * 1.08 : 1;
      const slot = (box.right - box.left) / points.length;
      const x = (i) => box.left + slot * (i + 0.5);
      const y = (v) => box.bottom - (box.bottom - box.top) * v / top;
      // Axes, three ticks, the labels of the options (every other one when they crowd).
      svg.append(svgElement("line", { x1: box.left, x2: box.right, y1: box.bottom, y2: box.bottom,
                                      class: "cl-axis" }));
      for (const v of [0, top / 2, top / 1.08]) {
        svg.append(svgElement("line", { x1: box.left, x2: box.right, y1: y(v), y2: y(v),
                                        class: "cl-grid" }));
        svg.append(svgElement("text", { x: box.left - 6, y: y(v) + 4, "text-anchor": "end" },
                              format(v)));
      }
      const every = slot < 44 ? Math.ceil(44 / slot) : 1;
      const chosen = points.findIndex((p) => p.current);
      points.forEach((p, i) => {
        if (p.current || (i % every === 0 && Math.abs(i - chosen) >= every)) {
          svg.append(svgElement("text", { x: x(i), y: box.bottom + 16, "text-anchor": "middle",
                                          class: p.current ? "cl-current" : "" }, p.label));
        }
      });
      const overLabel = this.spec.controls.find((c) => c.name === chart.over).label;
      svg.append(svgElement("text", { x: (box.left + box.right) / 2, y: height - 6,
                                      "text-anchor": "middle" }, overLabel));
      svg.append(svgElement("text", { x: 4, y: 12 }, chart.y_label));
      if (stacks) this.drawStacks(svg, points, parts, x, y, slot);
      else this.drawLine(svg, points, parts[0], x, y);
      if (limit >= 0 && !this.cellAt(this.choice).error) {
        const level = y(this.cellAt(this.choice).values[limit]);
        svg.append(svgElement("line", { x1: box.left, x2: box.right, y1: level, y2: level,
                                        class: "cl-limit" }));
      }
      const current = points.find((p) => p.current);
      svg.setAttribute("aria-label", `${chart.y_label} against ${overLabel}; ` +
        (current.cell.error ? "no result at the chosen options" : "the chosen option is marked"));
      this.drawLegend(stacks ? chart.parts : [], limit);
    }

    drawLine(svg, points, k, x, y) {
      // A cell without a result breaks the line.
      let path = "";
      let pen = "M";
      points.forEach((p, i) => {
        if (p.cell.error) { pen = "M"; return; }
        path += `${pen}${x(i)},${y(p.cell.values[k])}`;
        pen = "L";
      });
      svg.append(svgElement("path", { d: path, class: "cl-line" }));
      points.forEach((p, i) => {
        if (!p.cell.error) {
          const mark = p.current ? { r: 6, class: "cl-point cl-current" }
                                 : { r: 3, class: "cl-point" };
          svg.append(svgElement("circle", { cx: x(i), cy: y(p.cell.values[k]), ...mark }));
        }
      });
    }

    drawStacks(svg, points, parts, x, y, slot) {
      const width = Math.min(48, slot * 0.7);
      points.forEach((p, i) => {
        if (p.cell.error) return;
        let base = 0;
        parts.forEach((k, j) => {
          const value = p.cell.values[k];
          svg.append(svgElement("rect", { x: x(i) - width / 2, width: width, y: y(base + value),
                                          height: Math.max(0, y(base) - y(base + value)),
                                          fill: COLOURS[j % COLOURS.length] }));
          base += value;
        });
        if (p.current) {
          svg.append(svgElement("rect", { x: x(i) - width / 2 - 3, width: width + 6, y: y(base) - 3,
                                          height: y(0) - y(base) + 3, class: "cl-current-bar" }));
        }
      });
    }

    drawLegend(parts, limit) {
      this.legend.replaceChildren();
      parts.forEach((name, j) => {
        const item = element("li");
        item.append(element("span", { class: "cl-swatch",
                                      style: `background:${COLOURS[j % COLOURS.length]}` }),
                    document.createTextNode(this.spec.outputs[this.outputIndex(name)].label));
        this.legend.append(item);
      });
      if (limit >= 0) {
        const item = element("li");
        item.append(element("span", { class: "cl-swatch cl-dashed" }),
                    document.createTextNode(this.spec.outputs[limit].label));
        this.legend.append(item);
      }
    }
  }

  function start() {
    for (const root of document.querySelectorAll(".cl-explorer:not([data-ready])")) {
      root.dataset.ready = "true";
      const data = root.querySelector("script.cl-explorer-data");
      new Explorer(root, JSON.parse(data.textContent));
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
