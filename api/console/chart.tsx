/** A small bar chart as inline SVG: no script, no inline style, only attributes. */

/** One bar: its label (shown on hover) and value. */
export interface Bar {
  label: string;
  value: number;
}

const WIDTH = 600;
const HEIGHT = 140;
const PAD = { top: 12, right: 8, bottom: 22, left: 36 };

/** Bars left to right, scaled to the largest value; `title` names the chart for screen readers. */
export function BarChart({ bars, title, first, last }: {
  bars: Bar[];
  title: string;
  /** Labels under the first and the last bar. */
  first: string;
  last: string;
}) {
  const max = Math.max(1, ...bars.map((b) => b.value));
  const plotW = WIDTH - PAD.left - PAD.right;
  const plotH = HEIGHT - PAD.top - PAD.bottom;
  const step = plotW / Math.max(1, bars.length);
  const barW = Math.max(1, step - 2);
  const baseY = PAD.top + plotH;
  return (
    <svg
      class="chart"
      role="img"
      aria-label={title}
      viewBox={`0 0 ${WIDTH} ${HEIGHT}`}
      width={WIDTH}
      height={HEIGHT}
      xmlns="http://www.w3.org/2000/svg"
    >
      <title>{title}</title>
      <line class="axis" x1={PAD.left} y1={baseY} x2={WIDTH - PAD.right} y2={baseY} />
      <line class="axis" x1={PAD.left} y1={PAD.top} x2={WIDTH - PAD.right} y2={PAD.top} />
      <text x={PAD.left - 4} y={PAD.top + 4} text-anchor="end">{String(max)}</text>
      <text x={PAD.left - 4} y={baseY} text-anchor="end">0</text>
      {bars.map((b, i) => {
        const h = (b.value / max) * plotH;
        return (
          <rect
            key={i}
            class="bar"
            x={(PAD.left + i * step + 1).toFixed(1)}
            y={(baseY - h).toFixed(1)}
            width={barW.toFixed(1)}
            height={h.toFixed(1)}
          >
            <title>{`${b.label}: ${b.value}`}</title>
          </rect>
        );
      })}
      <text x={PAD.left} y={HEIGHT - 6}>{first}</text>
      <text x={WIDTH - PAD.right} y={HEIGHT - 6} text-anchor="end">{last}</text>
    </svg>
  );
}
