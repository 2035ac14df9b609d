import { greet, Shape, area } from "./shapes";

const shapes: Shape[] = [
  { kind: "circle", radius: 1 },
  { kind: "square", side: 3 },
  { kind: "rect", width: 2, height: 5 },
];

console.log(greet("cellbox"));
for (const s of shapes) {
  console.log(`${s.kind}: ${area(s).toFixed(2)}`);
}
