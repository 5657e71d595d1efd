"""Imported last by the fork server (`children.PRELOAD`): what the server imported lives until it
exits, so it is frozen out of the garbage collector.

The server ends by raising SystemExit when its parent closes the pipe, and the parent waits for
it. Unfrozen, the interpreter's exit would run a last collection over torch's hundreds of
thousands of objects, a noticeable part of every `advisor advise` run's exit. Its children
inherit the frozen objects too. A profile of the server's preload (`$ADVISOR_PROFILE_DIR`) ends
here, before its first fork.
"""

import gc

from advisor.execute.profiling import end_of_preload

gc.freeze()
end_of_preload()
