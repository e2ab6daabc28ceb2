"""Console detection: terminal or pipe, TFDIST_TF_LOGS; read from what is passed in."""

import io

from tfdist.cluster import Console, detect_console


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_pipe_is_not_interactive_and_tf_logs_default_off():
    assert detect_console({}, io.StringIO()) == Console(interactive=False, tf_logs=False)


def test_terminal_and_tf_logs_variable():
    assert detect_console({"TFDIST_TF_LOGS": "1"}, _Tty()) == Console(True, True)
    assert detect_console({"TFDIST_TF_LOGS": "0"}, _Tty()).tf_logs is False


def test_closed_stream_is_not_interactive():
    stream = io.StringIO()
    stream.close()
    assert detect_console({}, stream).interactive is False
