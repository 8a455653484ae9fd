// The inbox's keyboard shortcuts. Every action they take is a link or a form button of the
// page, which works the same without this script: a key only clicks or focuses it.
//   a  approve this card          d  deny: focus the comment, then Enter denies
//   c  decide call by call: open the choices and focus the first
//   j  next waiting card          k  previous waiting card
//   ?  show or hide the list of shortcuts
"use strict";
(function () {
  var denying = false;

  function typing(target) {
    return target && (target.tagName === "TEXTAREA" || target.tagName === "INPUT" ||
      target.tagName === "SELECT" || target.isContentEditable);
  }

  function click(id) {
    var element = document.getElementById(id);
    if (!element) return false;
    element.click();
    return true;
  }

  function startDenying() {
    var comment = document.getElementById("comment");
    if (!comment) return false;
    denying = true;
    var hint = document.getElementById("deny-hint");
    if (hint) hint.hidden = false;
    comment.focus();
    return true;
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.isComposing) return;
    if (typing(event.target)) {
      if (event.key === "Escape") {
        denying = false;
        event.target.blur();
      } else if (denying && event.target.id === "comment" && event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        click("deny");
      }
      return;
    }
    var done = false;
    switch (event.key) {
      case "a": done = click("approve"); break;
      case "d": done = startDenying(); break;
      case "c": {
        var byCall = document.getElementById("by-call");
        if (byCall) {
          byCall.open = true;
          var first = byCall.querySelector("input[type=radio]");
          if (first) first.focus();
          done = true;
        }
        break;
      }
      case "j": done = click("next-card"); break;
      case "k": done = click("prev-card"); break;
      case "?": {
        var list = document.getElementById("shortcuts");
        if (list) { list.open = !list.open; done = true; }
        break;
      }
    }
    if (done) event.preventDefault();
  });
})();
