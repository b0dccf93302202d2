/** A worker hosting 30 versions: `echo` and 29 no-op ones (bench/hosted/no_ops.ts). */
import { echo } from "../../workflows/builtin.ts";
import { noOps } from "./no_ops.ts";

export const hosted = [echo, ...noOps(30)];
