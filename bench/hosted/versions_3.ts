/** A worker hosting 3 versions: `echo` and 2 no-op ones (bench/hosted/no_ops.ts). */
import { echo } from "../../workflows/builtin.ts";
import { noOps } from "./no_ops.ts";

export const hosted = [echo, ...noOps(3)];
