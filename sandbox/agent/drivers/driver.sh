# cellbox code-context driver for bash (see sandbox/agent/code.go). Started
# by the agent as `bash -c <this>`: fd 3 brings one JSON request per line
# ({"file": cell source path, "n": cell number}), fd 4 takes {"ready":true}
# once set up, then one JSON answer per line; fd 1 and 2 are pipes the agent reads, and after a cell the
# driver writes a marker ($CELLBOX_CODE_MARK and the cell number) to both,
# before the answer. A cell is sourced in this shell, so cwd, variables, functions and aliases persist.
# SIGINT returns from the running cell (status 130) and is ignored between
# cells. A cell that runs `exit` ends the context.
exec 63<&3 62>&4 3<&- 4<&-
__cellbox_mark=$CELLBOX_CODE_MARK
unset CELLBOX_CODE_MARK
trap ':' INT
__cellbox_cell() {
	trap 'return 130' INT
	source "$1" </dev/null
}
printf '{"ready":true}\n' >&62
while IFS= read -r __cellbox_req <&63; do
	__cellbox_file=${__cellbox_req#*\"file\":\"}
	__cellbox_file=${__cellbox_file%%\"*}
	__cellbox_n=${__cellbox_req##*\"n\":}
	__cellbox_n=${__cellbox_n%%[!0-9]*}
	__cellbox_cell "$__cellbox_file"
	__cellbox_status=$?
	trap ':' INT
	printf '%s%08d' "$__cellbox_mark" "$__cellbox_n"
	printf '%s%08d' "$__cellbox_mark" "$__cellbox_n" >&2
	printf '{"exit_code":%d}\n' "$__cellbox_status" >&62
done
